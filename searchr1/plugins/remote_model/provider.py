"""RemoteModelProvider: the ModelProvider contract over a Tinker-shaped training service.

Created once per run by the ``taotoken`` / ``tinker`` factories. The core calls it exactly like
the ``local`` provider; what changes is where the work happens:

* ``sample`` -> ``SamplingClient.sample_async`` on the current sampler weights.
* ``forward_backward(datums, loss_fn, loss_scale)`` -> one ``TrainingClient.forward_backward``
  call with ``loss_fn.name`` (the service computes the loss; only its name travels). Each
  ``Datum`` becomes an SDK ``Datum`` with ``model_input = input_tokens`` and
  ``loss_fn_inputs = {target_tokens, logprobs, advantages}``. ``loss_scale`` is applied by
  multiplying the advantages, because the policy losses take no per-token weights (PyTRIO
  drops ``weights`` for them); the ``importance_sampling``, ``ppo`` and ``cispo`` losses are
  linear in the advantage (``ppo``: positively homogeneous), so this scales loss and gradient
  exactly. The returned ``loss`` is divided back by ``loss_scale`` so it means the same as
  the local provider's. The call is submitted and its result returned still in flight
  (:class:`PendingResult`): it is awaited when ``loss``/``metrics`` are first read, or by
  ``optim_step``, whichever comes first.
* ``optim_step(adam)`` -> ``TrainingClient.optim_step`` submitted right behind the step's
  ``forward_backward`` events, then all of them are awaited together (one service round trip
  per step instead of one per call; ``bench/remote_step.py``), then
  ``save_weights_and_get_sampling_client()``, so every later ``sample`` uses the new weights.
* ``save_state(folder)`` -> ``TrainingClient.save_state(name)`` (weights + optimizer state stay
  on the service); the returned checkpoint URI is written to ``folder/remote_checkpoint.json``,
  which is what ``--resume`` reads back. ``load_state(folder)`` starts a new training run from
  that URI with its optimizer state (``create_training_client_from_state_with_optimizer``).

LoRA. The service is told ``[lora] rank`` and which layer groups to adapt, read off
``target_modules`` (any of ``q/k/v/o_proj`` -> attention, any of ``gate/up/down_proj`` -> MLP,
``lm_head`` -> unembedding); ``alpha`` and ``dropout`` are the service's own (not sent).
:func:`searchr1.core.config_advice.unhonoured_settings` names each of these in a warning at the
start of ``config check``, ``smoke`` and ``train``.

Failures. Transient HTTP failures (408, 429, 5xx, connection errors, timeouts) are retried by
the SDK, and they are safe to retry: each training event carries an id that the service
de-duplicates, so a retried ``forward_backward`` is never accumulated twice. When the SDK gives
up (after ``retry_timeout_seconds``) the adapter raises a clear error; a 401/403 raises
"<KEY VARIABLE> was rejected" at once.

**A step is never half-applied; a failed step stops the run.** Neither SDK has a call that
clears the service's gradient buffer, and a ``forward_backward`` or ``optim_step`` whose result
was lost may or may not have been applied (PyTRIO marks its training client broken after such
a failure). So when ``forward_backward`` succeeded but ``optim_step`` failed -- or any training
call failed after retries -- the adapter refuses every further training call with
:class:`RemoteStepError`, and the run must be restarted with ``--resume``: ``load_state`` opens a
fresh training run from the last checkpoint saved by ``save_state``, whose weights and optimizer
state were written after a completed ``optim_step``. Steps after that checkpoint are re-run
from scratch; nothing of the failed step survives.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.core.config import ConfigError
from searchr1.core.logs import get_logger, redact_text
from searchr1.core.step_metrics import mismatch_from_logprobs
from searchr1.core.tokenizers import provider_tokenizer
from searchr1.core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    SampledSequence,
    SamplingParams,
    StopReason,
    Tokenizer,
)
from searchr1.plugins.remote_model import sdk as sdk_module
from searchr1.plugins.remote_model.errors import (
    RemoteModelError,
    RemoteServiceError,
    RemoteStepError,
    translate,
)
from searchr1.plugins.remote_model.pending import PendingResult
from searchr1.plugins.remote_model.settings import RemoteSettings, api_key_variable, load_settings

if TYPE_CHECKING:
    from searchr1.core.config import Config

T = TypeVar("T")
CHECKPOINT_FILE = "remote_checkpoint.json"
#: the policy losses a Tinker-shaped service computes by name (PyTRIO's list)
REMOTE_LOSSES = ("importance_sampling", "ppo", "cispo", "dro")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
log = get_logger()


class RemoteModelProvider:
    """A ModelProvider whose sampling and LoRA training run on a remote service."""

    def __init__(
        self,
        *,
        sdk: ModuleType,
        service: Any,
        tokenizer: Tokenizer,
        provider_name: str,
        api_base: str,
        base_model: str,
        lora_rank: int,
        lora_targets: Sequence[str],
        seed: int,
        settings: RemoteSettings,
        key_name: str,
    ):
        self._sdk = sdk
        self._service = service
        self._tokenizer = tokenizer
        self.provider_name = provider_name
        self.api_base = api_base
        self.base_model = base_model
        self.lora_rank = lora_rank
        self._train_attn = any(m in lora_targets for m in _ATTN)
        self._train_mlp = any(m in lora_targets for m in _MLP)
        self._train_unembed = "lm_head" in lora_targets
        self._seed = seed
        self._settings = settings
        self._key_name = key_name
        self._training: Any = None  # created on first use, or by load_state
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()
        #: set after a training call failed: the remote step state is unknown from then on
        self._broken: str | None = None
        #: forward_backward results submitted but not yet awaited (settled by optim_step)
        self._pending: list[PendingResult] = []

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(
        cls, config: Config, *, provider_name: str = "taotoken", default_sdk: str = "pytrio"
    ) -> RemoteModelProvider:
        """Check the config, import the SDK, authenticate and return a provider ready to sample.

        Raises ConfigError for a missing ``api_base`` / ``api_key``, MissingSDKError when the
        SDK is not installed, RemoteAuthError when the key is rejected."""
        settings = load_settings(config, provider_name, default_sdk)
        key_name = api_key_variable(config)
        if config.model.temperature != 1.0:
            # Tinker-shaped services are not told the sampling temperature when they train, so
            # their learner log-probs are presumably untempered while the sampler's are tempered:
            # on-policy ratios start away from 1 (the local provider tempers both). The seed runs
            # at 0.8, so this is said, not refused; each step's ratio_mean (from the log-probs
            # _forward_result reads back) logs the gap.
            from searchr1.core.config_advice import temperature_note

            log.warning(
                "remote_temperature_not_1",
                temperature=config.model.temperature,
                detail=temperature_note(config),
            )
        sdk = sdk_module.import_sdk(settings.sdk)
        tokenizer = provider_tokenizer(config, provider_name, settings.tokenizer)
        api_base = config.model.api_base.strip()
        try:
            service = sdk_module.open_service(sdk, api_base, config.model.api_key, settings)
        except Exception as exc:
            raise translate(
                exc,
                operation="login",
                api_base=api_base,
                key_name=key_name,
                retry_seconds=settings.retry_timeout_seconds,
            ) from exc
        provider = cls(
            sdk=sdk,
            service=service,
            tokenizer=tokenizer,
            provider_name=provider_name,
            api_base=api_base,
            base_model=config.model.base_model,
            lora_rank=config.lora.rank,
            lora_targets=config.lora.target_modules,
            seed=config.run.seed,
            settings=settings,
            key_name=key_name,
        )
        log.info(
            "remote_model_ready",
            provider=provider_name,
            sdk=settings.sdk,
            api_base=api_base,
            base_model=config.model.base_model,
            lora_rank=config.lora.rank,
        )
        return provider

    # ------------------------------------------------------------------ plumbing

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run one SDK call; translate its failure into a RemoteModelError."""
        try:
            return fn()
        except RemoteModelError:
            raise
        except Exception as exc:
            raise self._translate(exc, operation) from exc

    def _translate(self, exc: Exception, operation: str) -> RemoteModelError:
        """:func:`~searchr1.plugins.remote_model.errors.translate` with this provider's
        service URL, key name and retry budget."""
        return translate(
            exc,
            operation=operation,
            api_base=self.api_base,
            key_name=self._key_name,
            retry_seconds=self._settings.retry_timeout_seconds,
        )

    def _training_client(self) -> Any:
        if self._training is None:
            self._training = self._call(
                "create_lora_training_client",
                lambda: self._service.create_lora_training_client(
                    base_model=self.base_model,
                    rank=self.lora_rank,
                    seed=self._seed,
                    train_mlp=self._train_mlp,
                    train_attn=self._train_attn,
                    train_unembed=self._train_unembed,
                ),
            )
        return self._training

    def _sampling_client(self) -> Any:
        with self._sampler_lock:
            if self._sampler is None:
                if self._training is not None:
                    self._refresh_sampler()
                else:
                    # Before any training the adapter's weights are the base model's (LoRA
                    # starts as a no-op), so sample the base model without starting a trainer.
                    self._sampler = self._call(
                        "create_sampling_client",
                        lambda: self._service.create_sampling_client(base_model=self.base_model),
                    )
            return self._sampler

    def _refresh_sampler(self) -> None:
        training = self._training_client()
        self._sampler = self._call(
            "save_weights_and_get_sampling_client",
            training.save_weights_and_get_sampling_client,
        )

    def _check_trainable(self) -> None:
        if self._broken:
            raise RemoteStepError(self._broken)

    def _step_failed(self, operation: str, exc: RemoteModelError) -> RemoteStepError:
        self._broken = (
            f"{exc} -- the remote training state after this failed {operation} is unknown (it "
            f"may hold gradients or an update of the failed step), so this run cannot continue: "
            f"restart it with --resume to continue from the last checkpoint"
        )
        return RemoteStepError(self._broken, status_code=getattr(exc, "status_code", 0))

    # ------------------------------------------------------------------ ModelProvider

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """Sample ``num_samples`` continuations of ``prompt_tokens`` with the current weights."""
        sampler = self._sampling_client()
        sdk_params = self._sdk.SamplingParams(**self._sampling_kwargs(params))
        prompt = self._sdk.ModelInput.from_ints(list(prompt_tokens))
        try:
            response = await sampler.sample_async(
                prompt=prompt, num_samples=num_samples, sampling_params=sdk_params
            )
        except Exception as exc:
            raise self._translate(exc, "sample") from exc
        return [_sequence(seq) for seq in response.sequences]

    def _sampling_kwargs(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            kwargs["seed"] = params.seed
        # The SDK's ``stop`` is either strings or token ids, not both: when both are asked
        # for, stop tokens travel as their text (special tokens decode to their literal text).
        if params.stop_strings:
            stops = list(params.stop_strings)
            for token_id in params.stop_token_ids:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
                if text and text not in stops:
                    stops.append(text)
            kwargs["stop"] = stops
        elif params.stop_token_ids:
            kwargs["stop"] = list(params.stop_token_ids)
        return kwargs

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        """Accumulate gradients of ``loss_scale * sum(loss over datums)`` on the service."""
        self._check_trainable()
        if not datums:
            return ForwardBackwardResult(loss=0.0, metrics={"tokens": 0.0})
        if loss_fn.name not in REMOTE_LOSSES:
            raise ConfigError(
                [
                    f"train.loss_fn = {loss_fn.name!r}: the remote service computes the loss by "
                    f"name and knows only {', '.join(REMOTE_LOSSES)}; use one of them or the "
                    f"local provider"
                ]
            )
        if not (loss_scale > 0.0 and math.isfinite(loss_scale)):
            raise ValueError(f"loss_scale must be a positive finite number, got {loss_scale}")
        data = [self._sdk_datum(d, loss_scale) for d in datums]
        config = _loss_config(loss_fn)
        training = self._training_client()
        try:
            # Both SDKs queue the event and return a future at once; the answer is awaited
            # only when the result is read or when optim_step runs (see PendingResult).
            future = self._call(
                "forward_backward",
                lambda: training.forward_backward(
                    data, loss_fn=loss_fn.name, loss_fn_config=config
                ),
            )
        except RemoteModelError as exc:
            raise self._step_failed("forward_backward", exc) from exc
        pending = PendingResult(lambda: self._await_forward(future, datums, loss_scale))
        self._pending.append(pending)
        return pending

    def _await_forward(
        self, future: Any, datums: Sequence[Datum], loss_scale: float
    ) -> ForwardBackwardResult:
        """Wait for one submitted ``forward_backward``; a failure breaks the run."""
        try:
            output = self._call("forward_backward", future.result)
        except RemoteModelError as exc:
            raise self._step_failed("forward_backward", exc) from exc
        return _forward_result(output, datums, loss_scale)

    def _settle(self) -> None:
        """Wait for every submitted ``forward_backward``, in submission order; the first failure
        raises (and breaks the run). Called by optim_step, save_state and close."""
        pending, self._pending = self._pending, []
        for result in pending:
            result.resolve()

    def _sdk_datum(self, datum: Datum, loss_scale: float) -> Any:
        import numpy as np

        return self._sdk.Datum(
            model_input=self._sdk.ModelInput.from_ints(list(datum.input_tokens)),
            loss_fn_inputs={
                "target_tokens": np.asarray(datum.target_tokens, dtype=np.int64),
                "logprobs": np.asarray(datum.sampler_logprobs, dtype=np.float32),
                "advantages": np.asarray(datum.advantages, dtype=np.float64) * loss_scale,
            },
        )

    def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """One optimizer step on the accumulated gradients, then point sampling at the result."""
        self._check_trainable()
        training = self._training_client()
        params = self._sdk.AdamParams(
            learning_rate=adam.learning_rate,
            beta1=adam.beta1,
            beta2=adam.beta2,
            eps=adam.eps,
            weight_decay=adam.weight_decay,
            grad_clip_norm=adam.grad_clip_norm or 0.0,
        )
        # Submitted behind the step's forward_backward events before any of them is awaited,
        # so the step costs one wait for all of them instead of one wait each.
        try:
            future = self._call("optim_step", lambda: training.optim_step(params))
        except RemoteModelError as exc:
            raise self._step_failed("optim_step", exc) from exc
        self._settle()
        try:
            response = self._call("optim_step", future.result)
        except RemoteModelError as exc:
            raise self._step_failed("optim_step", exc) from exc
        with self._sampler_lock:
            # Forget the old sampler first: if the refresh fails, the next sample retries it
            # instead of silently sampling the weights from before this step.
            self._sampler = None
            self._refresh_sampler()
        metrics = getattr(response, "metrics", None) or {}
        return {str(k): float(v) for k, v in metrics.items() if isinstance(v, int | float)}

    def save_state(self, path: str) -> None:
        """Save weights + optimizer state on the service; record the URI under ``path``."""
        self._settle()
        self._check_trainable()
        folder = Path(path)
        name = _checkpoint_name(folder.name)
        training = self._training_client()
        kwargs: dict[str, Any] = {}
        if self._settings.checkpoint_ttl_seconds:
            kwargs["ttl_seconds"] = self._settings.checkpoint_ttl_seconds
        saved = self._call("save_state", lambda: training.save_state(name, **kwargs).result())
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "format": 1,
            "provider": self.provider_name,
            "sdk": self._sdk.__name__,
            "api_base": redact_text(self.api_base),  # a key may sit in its query string
            "base_model": self.base_model,
            "lora_rank": self.lora_rank,
            "checkpoint_name": name,
            "checkpoint_uri": saved.path,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tmp = folder / f".{CHECKPOINT_FILE}.tmp"
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        tmp.replace(folder / CHECKPOINT_FILE)
        log.info("remote_checkpoint_saved", path=str(folder), checkpoint_uri=saved.path)

    def load_state(self, path: str) -> None:
        """Continue from a checkpoint written by :meth:`save_state` (weights + optimizer)."""
        record = read_checkpoint(Path(path))
        uri = record["checkpoint_uri"]
        if record.get("api_base") and record["api_base"] != redact_text(self.api_base):
            log.warning(
                "remote_checkpoint_other_service",
                saved_at=record["api_base"],
                current=self.api_base,
            )
        self._training = self._call(
            "create_training_client_from_state_with_optimizer",
            lambda: self._service.create_training_client_from_state_with_optimizer(uri),
        )
        self._broken = None
        self._pending = []  # anything submitted to the old training run is abandoned with it
        with self._sampler_lock:
            self._refresh_sampler()
        log.info("remote_checkpoint_loaded", path=str(path), checkpoint_uri=uri)

    def close(self) -> None:
        # Results already handed out stay readable after close: wait for them here (a failure
        # stays in its result and is raised when read; closing must not raise it).
        pending, self._pending = self._pending, []
        for result in pending:
            try:
                result.resolve()
            except Exception:
                pass
        self._training = None
        self._sampler = None
        try:
            sdk_module.close_service(self._service)
        except Exception as exc:  # closing must not hide the error that ended the run
            log.warning("remote_close_failed", error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------- helpers


def read_checkpoint(folder: Path) -> dict[str, Any]:
    """The record :meth:`RemoteModelProvider.save_state` wrote in ``folder``."""
    file = folder / CHECKPOINT_FILE
    if not file.is_file():
        raise RemoteServiceError(
            f"{folder}: no {CHECKPOINT_FILE}; this checkpoint was not written by a remote model "
            f"provider (resume it with the provider that saved it)"
        )
    record = json.loads(file.read_text("utf-8"))
    if not isinstance(record, dict) or not record.get("checkpoint_uri"):
        raise RemoteServiceError(f"{file}: no checkpoint_uri in the record")
    return record


def _checkpoint_name(folder_name: str) -> str:
    """A service-side checkpoint name: the folder's name, made safe, plus a unique suffix (a
    rerun after --resume saves the same step again and must not collide)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", folder_name).strip("-._") or "state"
    return f"{stem[:80]}-{uuid.uuid4().hex[:8]}"


def _loss_config(loss_fn: LossFn) -> dict[str, float] | None:
    """Clip bounds of ppo/cispo as Tinker's ``loss_fn_config`` (ratio thresholds)."""
    keywords = getattr(getattr(loss_fn, "fn", None), "keywords", None) or {}
    if "clip_low" in keywords and "clip_high" in keywords:
        return {
            "clip_low_threshold": 1.0 - float(keywords["clip_low"]),
            "clip_high_threshold": 1.0 + float(keywords["clip_high"]),
        }
    return None


def _stop_reason(value: Any) -> StopReason:
    text = str(getattr(value, "value", value) or "").lower()
    return "length" if text in ("length", "max_tokens", "max_length") else "stop"


def _sequence(seq: Any) -> SampledSequence:
    tokens = tuple(int(t) for t in seq.tokens)
    logprobs = tuple(float(x) for x in (seq.logprobs or ()))
    if len(logprobs) != len(tokens):
        raise RemoteServiceError(
            f"the service returned {len(tokens)} tokens but {len(logprobs)} log-probs for one "
            f"sample; the trainer needs one sampler log-prob per token"
        )
    return SampledSequence(
        tokens=tokens, logprobs=logprobs, stop_reason=_stop_reason(seq.stop_reason)
    )


def _forward_result(
    output: Any, datums: Sequence[Datum], loss_scale: float
) -> ForwardBackwardResult:
    """The service's loss (unscaled back, as the local provider reports it) plus the metrics
    the local provider reports, recomputed from the per-token log-probs the service returns:
    sums (``tokens``, ``ratio_sum``), ``ratio_max``, ``ratio_mean``, ``logprob_diff_max``
    (largest |learner - sampler| log-prob on trained positions) and the ``mismatch/*``
    metrics (:func:`searchr1.core.step_metrics.mismatch_from_logprobs`)."""
    raw = {str(k): v for k, v in (getattr(output, "metrics", None) or {}).items()}
    loss = float(raw.get("loss_sum", raw.get("loss:sum", 0.0))) / loss_scale
    tokens = ratio_sum = ratio_max = diff_max = 0.0
    learner_lps: list[float] = []
    sampler_lps: list[float] = []
    outputs = list(getattr(output, "loss_fn_outputs", None) or [])
    for datum, out in zip(datums, outputs, strict=False):
        logprobs = out.get("logprobs") if isinstance(out, Mapping) else None
        if logprobs is None:
            continue
        values = logprobs.tolist() if hasattr(logprobs, "tolist") else list(logprobs)
        for lp, old, adv in zip(values, datum.sampler_logprobs, datum.advantages, strict=False):
            if adv != 0.0:
                ratio = math.exp(float(lp) - old)
                tokens += 1.0
                ratio_sum += ratio
                ratio_max = max(ratio_max, ratio)
                diff_max = max(diff_max, abs(float(lp) - old))
                learner_lps.append(float(lp))
                sampler_lps.append(old)
    metrics: dict[str, float] = {"datums": float(len(datums)), "loss": loss}
    if tokens:
        metrics.update(
            tokens=tokens,
            ratio_sum=ratio_sum,
            ratio_max=ratio_max,
            ratio_mean=ratio_sum / tokens,
            logprob_diff_max=diff_max,
        )
        metrics.update(mismatch_from_logprobs(learner_lps, sampler_lps))
    else:  # the service returned no log-probs: count trained positions ourselves
        metrics["tokens"] = float(sum(1 for d in datums for a in d.advantages if a != 0.0))
    return ForwardBackwardResult(loss=loss, metrics=metrics)
