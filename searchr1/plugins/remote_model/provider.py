"""RemoteModelProvider: the Sampler and Trainer contracts over a Tinker-shaped training service.

Created once per run by the ``taotoken`` / ``tinker`` factories. The core calls it exactly like
the ``local`` provider; what changes is where the work happens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.kit.http import Channel
from searchr1.kit.tokenizers import provider_tokenizer
from searchr1.plugins.remote_model.advice import temperature_note
from searchr1.plugins.remote_model.checkpoints import checkpoint_name, read_checkpoint, write_record
from searchr1.plugins.remote_model.conversions import (
    REMOTE_CAPABILITIES,
    forward_result,
    lora_groups,
    loss_config,
    sampling_kwargs,
    sdk_datum,
    to_sequence,
)
from searchr1.plugins.remote_model.sdk import (
    answer,
    close_service,
    import_sdk,
    open_service,
    queues_sampler_save,
    resolve,
    submit,
)
from searchr1.plugins.remote_model.sdk import sample as sdk_sample
from searchr1.plugins.remote_model.settings import RemoteSettings, api_key_variable, load_settings
from searchr1.sdk import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    RemoteError,
    RemoteMalformed,
    RemoteStepError,
    SampledSequence,
    SamplingParams,
    Tokenizer,
    TrainerCapabilities,
    check_loss,
    get_logger,
    redact_text,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config

T = TypeVar("T")
log = get_logger()


class RemoteModelProvider:
    """The ``taotoken``/``tinker`` providers' :class:`~searchr1.core.types.Sampler` and
    :class:`~searchr1.core.types.Trainer` in one object: sampling and LoRA training run on
    a remote service."""

    def __init__(
        self, config: Config, *, provider_name: str = "taotoken", default_sdk: str = "pytrio"
    ):
        """Log in: check the config (ConfigError for a missing ``api_base`` / ``api_key``),
        import the SDK (MissingSDKError), load the tokenizer and open the service session
        (a RemoteError of the failure's class: a rejected key, a host that does not resolve,
        ...); then the provider is ready to sample."""
        settings = load_settings(config, provider_name, default_sdk)
        self.provider_name = provider_name
        self.api_base = config.model.api_base.strip()
        self.base_model = config.model.base_model
        self.lora_rank = config.lora.rank
        self._lora_groups = lora_groups(config.lora.target_modules)
        self._seed = config.run.seed
        self._settings = settings
        self.channel = _channel(config, provider_name, settings)
        if config.model.temperature != 1.0:
            # Said again here, not only in the config advice: the Python API opens no run
            # folder and prints no advice, and the reference setup runs at 0.8.
            log.warning(
                "remote_temperature_not_1",
                temperature=config.model.temperature,
                detail=temperature_note(config),
            )
        self._sdk = import_sdk(settings.sdk)
        self.tokenizer: Tokenizer = provider_tokenizer(config, provider_name, settings.tokenizer)
        self.channel.announce()
        try:
            self._service = open_service(self._sdk, self.api_base, config.model.api_key, settings)
        except Exception as exc:
            raise self.channel.error(exc, "login") from exc
        self._training: Any = None  # created on first use, or by load_state
        self._sampler: Any = None
        self._pinned: Any = None  # the one a pipelined rollout samples (snapshot_sampler)
        self._sampler_lock = asyncio.Lock()
        #: set after a training call failed: the remote step state is unknown from then on
        self._broken: RemoteStepError | None = None
        #: the answers of the forward_backward calls since the last optim_step (which
        #: awaits them)
        self._pending: list[asyncio.Future[ForwardBackwardResult]] = []
        log.info(
            "remote_model_ready",
            provider=provider_name,
            sdk=settings.sdk,
            api_base=self.api_base,
            base_model=self.base_model,
            lora_rank=self.lora_rank,
        )

    # ------------------------------------------------------------------ service calls

    def _call(self, operation: str, fn: Callable[[], T], *, step: bool = False) -> T:
        """Run one SDK call; its failure becomes the RemoteError of its class (``step``: a
        training call, whose failure breaks the run, :meth:`_step_failed`)."""
        with self._failures(operation, step=step):
            return fn()

    async def _answer(self, operation: str, submitted: Any, *, step: bool = False) -> Any:
        """The answer of a submitted SDK call (:func:`~.sdk.submit`), waiting at most
        ``result_timeout_seconds`` (tinker retries a failing result poll forever); a failure
        as in :meth:`_call`."""
        with self._failures(operation, step=step):
            return await answer(submitted, self._settings.result_timeout_seconds or None)

    async def _submit(
        self, operation: str, client: Any, *args: Any, step: bool = True, **kwargs: Any
    ) -> Any:
        """Submit call ``operation`` of ``client``; its future (``step``: a training call,
        whose failure breaks the run)."""
        with self._failures(operation, step=step):
            return await submit(self._sdk, client, operation, *args, **kwargs)

    @contextmanager
    def _failures(self, operation: str, *, step: bool) -> Iterator[None]:
        """A failure of the block as the RemoteError of its class (``step``: it breaks the
        run)."""
        try:
            try:
                yield
            except RemoteError:
                raise
            except TimeoutError as exc:  # concurrent.futures.TimeoutError since 3.11
                # no answer within our own bound of the wait (the SDK may retry for longer)
                seconds = self._settings.result_timeout_seconds
                setting = f"[model.{self.provider_name}] result_timeout_seconds = {seconds}"
                waited = dataclasses.replace(
                    self.channel, timeout_s=seconds, timeout_setting=setting
                )
                raise waited.error(exc, operation) from exc
            except Exception as exc:
                raise self.channel.error(exc, operation) from exc
        except RemoteError as exc:
            if step:
                raise self._step_failed(operation, exc) from exc
            raise

    def _wait(self, future: Any) -> Any:
        """The answer of a submitted call (or the client a tinker future resolves to), waiting
        at most ``result_timeout_seconds``: tinker retries a failing result poll forever."""
        return resolve(future, self._settings.result_timeout_seconds or None)

    # ------------------------------------------------------------------ clients

    async def _training_client(self) -> Any:
        if self._training is None:
            operation = "create_lora_training_client"
            created = await self._submit(operation, self._service, step=False, **self._lora_run())
            self._training = await self._answer(operation, created)
        return self._training

    def _lora_run(self) -> dict[str, Any]:
        """The arguments of ``create_lora_training_client``."""
        return {
            "base_model": self.base_model,
            "rank": self.lora_rank,
            "seed": self._seed,
            **self._lora_groups,
        }

    async def _sampling_client(self) -> Any:
        """The sampler of the current weights, created on first use (once, however many
        samples ask at the same time)."""
        async with self._sampler_lock:
            if self._sampler is None:
                if self._training is not None:
                    operation, client, kwargs = (
                        "save_weights_and_get_sampling_client", self._training, {}
                    )  # fmt: skip
                else:
                    # Before any training the adapter's weights are the base model's (LoRA
                    # starts as a no-op), so sample the base model without starting a trainer.
                    operation, client = "create_sampling_client", self._service
                    kwargs = {"base_model": self.base_model}
                submitted = await self._submit(operation, client, step=False, **kwargs)
                self._sampler = await self._answer(operation, submitted)
            return self._sampler

    def _check_trainable(self) -> None:
        if self._broken is not None:
            raise RemoteStepError(str(self._broken), self._broken)

    def _step_failed(self, operation: str, exc: RemoteError) -> RemoteStepError:
        self._broken = RemoteStepError(
            f"{exc} -- the remote training state after this failed {operation} is unknown (it "
            f"may hold gradients or an update of the failed step), so this run cannot continue: "
            f"restart it with --resume to continue from the last checkpoint",
            exc,
        )
        return self._broken

    # ------------------------------------------------------------------ Sampler, Trainer

    @property
    def capabilities(self) -> TrainerCapabilities:
        """The losses the service computes by name, a snapshot sampler, and no learner
        temperature (the service scores at its own)."""
        return dataclasses.replace(REMOTE_CAPABILITIES, snapshot_sampler=self.snapshot_sampler)

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """Sample ``num_samples`` continuations of ``prompt_tokens`` with the current weights."""
        sampler = self._pinned or self._sampler or await self._sampling_client()
        sdk_params = self._sdk.SamplingParams(**sampling_kwargs(params, self.tokenizer))
        prompt = self._sdk.ModelInput.from_ints(list(prompt_tokens))
        seconds = self._settings.sampling_timeout_seconds
        try:
            response = await asyncio.wait_for(
                sdk_sample(
                    sampler, prompt=prompt, num_samples=num_samples, sampling_params=sdk_params
                ),
                seconds,
            )
        except TimeoutError as exc:  # tinker waits for a sample without a bound of its own
            setting = f"[model.{self.provider_name}] sampling_timeout_seconds = {seconds}"
            waited = dataclasses.replace(self.channel, timeout_s=seconds, timeout_setting=setting)
            raise waited.error(exc, "sample") from exc
        except Exception as exc:
            raise self.channel.error(exc, "sample") from exc
        try:
            return [to_sequence(seq) for seq in response.sequences]
        except ValueError as exc:  # a sample without a log-prob per token
            raise self.channel.failed(RemoteMalformed, str(exc), "sample") from exc

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Awaitable[ForwardBackwardResult]:
        """Submit the gradients of ``loss_scale * sum(loss over datums)`` to the service; the
        awaitable of its answer."""
        self._check_trainable()
        if not datums:
            return _answered(ForwardBackwardResult(loss=0.0, metrics={"tokens": 0.0}))
        # Also for callers that skipped the build check: nothing unknown reaches the service.
        check_loss(self.capabilities, loss_fn, field="loss_fn", provider=self.provider_name)
        if not (loss_scale > 0.0 and math.isfinite(loss_scale)):
            raise ValueError(f"loss_scale must be a positive finite number, got {loss_scale}")
        data = [sdk_datum(self._sdk, d, loss_scale) for d in datums]
        config = loss_config(loss_fn)
        training = await self._training_client()
        # Both SDKs queue the event and return its future; the answer is awaited by the
        # caller, or by optim_step (which settles the step's answers before its own).
        future = await self._submit(
            "forward_backward", training, data, loss_fn=loss_fn.name, loss_fn_config=config
        )
        result = asyncio.ensure_future(self._forward_result(future, datums, loss_scale))
        self._pending.append(result)
        return result

    async def _forward_result(
        self, future: Any, datums: Sequence[Datum], loss_scale: float
    ) -> ForwardBackwardResult:
        """Wait for one submitted ``forward_backward``; a failure breaks the run."""
        output = await self._answer("forward_backward", future, step=True)
        return forward_result(output, datums, loss_scale)

    async def snapshot_sampler(self) -> None:
        """Pipelined steps: sample the newest sampler until the next call, whatever optim_step
        does meanwhile (a client names saved weights, so it stays valid)."""
        self._pinned = self._sampler

    async def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """One optimizer step on the accumulated gradients, then point sampling at the result."""
        self._check_trainable()
        training = await self._training_client()
        params = self._sdk.AdamParams(
            learning_rate=adam.learning_rate,
            beta1=adam.beta1,
            beta2=adam.beta2,
            eps=adam.eps,
            weight_decay=adam.weight_decay,
            grad_clip_norm=adam.grad_clip_norm or 0.0,
        )
        # Submitted behind the step's forward_backward events before any of them is awaited,
        # so the step costs one wait for all of them instead of one wait each; where the SDK
        # queues it (tinker), the sampler save goes behind them in the same wait.
        future = await self._submit("optim_step", training, params)
        sampler_save = None
        if queues_sampler_save(self._sdk):
            sampler_save = await self._submit(
                "save_weights_and_get_sampling_client", training, step=False
            )
        pending, self._pending = self._pending, []
        for result in pending:  # in submission order: the first failure raises
            await result
        response = await self._answer("optim_step", future, step=True)
        # The old sampler stays until the new one exists (a pin taken meanwhile gets the
        # weights the loop records); if the refresh fails it is dropped, so the next sample
        # retries it instead of silently sampling the weights from before this step.
        try:
            if sampler_save is None:
                sampler_save = await self._submit(
                    "save_weights_and_get_sampling_client", training, step=False
                )
            self._sampler = await self._answer("save_weights_and_get_sampling_client", sampler_save)
        except BaseException:
            self._sampler = None
            raise
        metrics = getattr(response, "metrics", None) or {}
        return {str(k): float(v) for k, v in metrics.items() if isinstance(v, int | float)}

    def save_state(self, path: str) -> None:
        """Save weights + optimizer state on the service; record the URI under ``path``."""
        self._check_trainable()
        folder = Path(path)
        name = checkpoint_name(folder.name)
        if self._training is None:  # a save before any step (the best of step 0)
            self._training = self._call(
                "create_lora_training_client",
                lambda: self._wait(self._service.create_lora_training_client(**self._lora_run())),
            )
        training = self._training
        kwargs: dict[str, Any] = {}
        if self._settings.checkpoint_ttl_seconds:
            kwargs["ttl_seconds"] = self._settings.checkpoint_ttl_seconds
        saved = self._call("save_state", lambda: self._wait(training.save_state(name, **kwargs)))
        write_record(
            folder,
            provider=self.provider_name,
            sdk=self._sdk.__name__,
            api_base=self.api_base,
            base_model=self.base_model,
            lora_rank=self.lora_rank,
            checkpoint_name=name,
            checkpoint_uri=saved.path,
        )
        log.info("remote_checkpoint_saved", path=str(folder), checkpoint_uri=saved.path)

    async def load_state(self, path: str) -> None:
        """Continue from a checkpoint written by :meth:`save_state` (weights + optimizer);
        sampling uses the loaded weights once it returns."""
        record = read_checkpoint(Path(path))
        uri = record["checkpoint_uri"]
        if record.get("api_base") and record["api_base"] != redact_text(self.api_base):
            log.warning(
                "remote_checkpoint_other_service",
                saved_at=record["api_base"],
                current=self.api_base,
            )
        operation = "create_training_client_from_state_with_optimizer"
        created = await self._submit(operation, self._service, uri, step=False)
        self._training = await self._answer(operation, created)
        self._broken = None
        self._pending = []  # anything submitted to the old training run is abandoned with it
        self._pinned = None  # the loaded weights are the newest: sample them
        operation = "save_weights_and_get_sampling_client"
        saved = await self._submit(operation, self._training, step=False)
        self._sampler = await self._answer(operation, saved)
        log.info("remote_checkpoint_loaded", path=str(path), checkpoint_uri=uri)

    def close(self) -> None:
        self._pending = []
        self._training = None
        self._sampler = self._pinned = None
        try:
            close_service(self._service)
        except Exception as exc:  # closing must not hide the error that ended the run
            log.warning("remote_close_failed", error=f"{type(exc).__name__}: {exc}")


async def _answered(result: ForwardBackwardResult) -> ForwardBackwardResult:
    return result


def _channel(config: Config, provider_name: str, settings: RemoteSettings) -> Channel:
    """The service as its failures and its first contact name it: the address, the key's
    variable, the model, and how long the SDK waits and retries."""
    table = f"[model.{provider_name}]"
    if settings.sdk == "pytrio":
        timeout_s, timeout_setting = (
            float(settings.request_timeout_seconds),
            (f"{table} request_timeout_seconds"),
        )
        retries = (
            f"retrying 408/429/5xx and connection errors for up to "
            f"{settings.retry_timeout_seconds:g} s ({table} retry_timeout_seconds)"
        )
    else:  # tinker's own: 60 s a request, retries for up to 300 s; our bound on every wait
        timeout_s, timeout_setting = 60.0, ""
        retries = (
            f"the SDK retrying for up to 300 s, every wait at most "
            f"{settings.result_timeout_seconds} s ({table} result_timeout_seconds)"
        )
    return Channel(
        service=f"the model service of provider {provider_name!r} ({settings.sdk} SDK)",
        url=config.model.api_base.strip(),
        address="model.api_base",
        key=api_key_variable(config, provider_name),
        model=config.model.base_model,
        timeout_s=timeout_s,
        timeout_setting=timeout_setting,
        retries=retries,
    )
