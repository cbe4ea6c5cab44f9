"""``VllmModelProvider``: a vLLM server's sampling composed with the local learner.

Created once per run by the ``vllm`` factory (``[model] provider = "vllm"``) through
:meth:`VllmModelProvider.from_config`. Training is the local provider's own
:class:`~searchr1.plugins.local_model.learner.Learner` on the model
:func:`~searchr1.plugins.local_model.provider.load_lora_model` loads (same LoRA, optimizer,
checkpoints and resume, and the learner's sampler/learner mismatch metrics); :meth:`sample`
goes to the server.

The policy the server samples from is always the trainer's current adapter: at start, after
each :meth:`optim_step` and after :meth:`load_state`, the adapter is saved into a new folder
under ``adapters_dir``, loaded under a new name (``searchr1-<run token>-<version>``; a new name,
so no cached prefix computed with older weights is reused), the previous one is unloaded and
its folder removed. The LoRA B matrices start at zero, so version 0 samples exactly the base.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.logs import get_logger
from searchr1.core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    SampledSequence,
    SamplingParams,
    TrainerCapabilities,
)
from searchr1.plugins.local_model.learner import Learner
from searchr1.plugins.local_model.provider import LocalSettings, load_lora_model, make_learner
from searchr1.plugins.local_model.sample_request import check_request
from searchr1.plugins.vllm_model.client import VllmClient, VllmError
from searchr1.plugins.vllm_model.server import (
    VllmServer,
    free_port,
    server_command,
    wait_ready,
)
from searchr1.plugins.vllm_model.settings import VllmSettings, settings_problems

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

log = get_logger()


@dataclass(frozen=True)
class _Adapter:
    name: str
    local_dir: Path


class VllmModelProvider:
    """The ``vllm`` provider's :class:`~searchr1.core.types.Sampler` (on the vLLM server) and
    :class:`~searchr1.core.types.Trainer` (the local learner, with its declared capabilities:
    any loss, a snapshot sampler that pins one served adapter, the learner's temperature)."""

    client: VllmClient | None = None
    server: VllmServer | None = None
    adapter: _Adapter | None = None
    #: the adapter pipelined steps sample on (None: always the newest, ``adapter``)
    pinned: _Adapter | None = None
    max_model_len: int = 0
    keep_server_log: bool = False

    def __init__(self, learner: Learner, tokenizer: Any) -> None:
        """``learner`` trains the peft model whose adapter the server samples with."""
        self.learner = learner
        self.model = learner.model
        self.model_lock = learner.model_lock
        self.vocab_size = learner.vocab_size
        self._tokenizer = tokenizer
        self._token = secrets.token_hex(3)
        self._version = 0
        self._retired: list[_Adapter] = []  # replaced but maybe still sampled (pinned)
        self._retired_lock = threading.Lock()
        self._workdir = Path(tempfile.mkdtemp(prefix="searchr1-vllm-"))

    @classmethod
    def from_config(cls, config: Config) -> VllmModelProvider:
        """Check ``[model.vllm]``, load the model for training (``[model.local]``'s device,
        dtype and learner settings), reach or launch the server, and publish the initial
        adapter."""
        from searchr1.core.config_validate import plugin_settings
        from searchr1.core.errors import ConfigError

        settings = plugin_settings(config, "model", "vllm", VllmSettings)
        problems = settings_problems(settings)
        if problems:
            raise ConfigError([f"{config.source}: {problem}" for problem in problems])
        # top_p < 1 is announced before the run (the factory's advise, vllm_model/__init__.py)
        local = plugin_settings(config, "model", "local", LocalSettings)
        model, tokenizer, device, _ = load_lora_model(config, local)
        lock = threading.Lock()
        learner = make_learner(model, tokenizer, device, lock, config.model.temperature, local)
        provider = cls(learner, tokenizer)
        with _sigterm_raises():
            try:
                provider._connect(config, settings)
            except BaseException:
                provider.keep_server_log = True  # the error names it
                provider.close()
                raise
        return provider

    def _connect(self, config: Config, settings: VllmSettings) -> None:
        self._adapters = Path(settings.adapters_dir) if settings.adapters_dir else self._workdir
        self._server_adapters = settings.server_adapters_dir or str(self._adapters)
        self._adapters.mkdir(parents=True, exist_ok=True)
        if settings.api_base:
            api_base = settings.api_base
        else:
            port = free_port()
            api_base = f"http://127.0.0.1:{port}"
            command = server_command(
                str(Path(settings.python).expanduser()),
                model=_served_path(config.model.base_model),
                port=port,
                dtype=str(next(self.model.parameters()).dtype).removeprefix("torch."),
                max_model_len=settings.max_model_len
                or min(config.rollout.max_trajectory_tokens, self.learner.context_length),
                lora_rank=config.lora.rank,
                seed=config.run.seed,
                extra=settings.server_args,
            )
            # Outside the temporary folder: a failed start keeps it (the error names it);
            # a clean close removes it.
            log_path = Path(tempfile.gettempdir()) / f"searchr1-vllm-{self._token}.log"
            self.server = VllmServer.launch(command, log_path)
        self.client = VllmClient(
            api_base,
            request_timeout_s=settings.request_timeout_s,
            max_connections=settings.max_connections,
            # A server started with --api-key wants it; [model] api_key holds it (a secret).
            api_key=settings.api_key if settings.api_base else "",
        )
        waited = wait_ready(
            self.client.healthy,
            where=api_base,
            timeout_s=settings.startup_timeout_s,
            server=self.server,
        )
        self.max_model_len = _base_max_model_len(self.client.models(), api_base)
        self.publish_adapter()
        log.info(
            "vllm_ready",
            api_base=api_base,
            launched=self.server is not None,
            ready_after_s=round(waited, 1),
            max_model_len=self.max_model_len,
            adapter=self.adapter.name if self.adapter else None,
        )

    # ------------------------------------------------------------------ adapter sync

    def publish_adapter(self) -> float:
        """Save the current adapter, load it on the server under a new name, unload the old
        one; returns the seconds it took. Sampling uses the new one from now on."""
        assert self.client is not None
        t0 = time.perf_counter()
        name = f"searchr1-{self._token}-{self._version}"
        local_dir = self._adapters / name
        with self.model_lock:
            self.model.save_pretrained(str(local_dir))
        try:
            self.client.load_adapter(name, f"{self._server_adapters.rstrip('/')}/{name}")
        except BaseException:
            shutil.rmtree(local_dir, ignore_errors=True)
            raise
        old, self.adapter = self.adapter, _Adapter(name, local_dir)
        self._version += 1
        if old is not None and old is self.pinned:
            # Pipelined steps: a rollout may still sample it; unloaded at the next pin.
            with self._retired_lock:
                self._retired.append(old)
        elif old is not None:
            self._drop(old)
        return time.perf_counter() - t0

    def snapshot_sampler(self) -> None:
        """Pipelined steps (``train.max_staleness > 0``): sample on the newest published
        adapter until the next call, and unload the adapters no rollout samples any more."""
        self.pinned = self.adapter
        with self._retired_lock:
            retired, self._retired = self._retired, []
        for old in retired:
            if old is not self.pinned:
                self._drop(old)

    def _drop(self, adapter: _Adapter) -> None:
        assert self.client is not None
        try:
            self.client.unload_adapter(adapter.name)
        except VllmError as exc:  # a leftover adapter costs server memory, not correctness
            log.warning("vllm_unload_failed", adapter=adapter.name, error=str(exc))
        shutil.rmtree(adapter.local_dir, ignore_errors=True)

    # ------------------------------------------------------------------ Sampler, Trainer

    @property
    def capabilities(self) -> TrainerCapabilities:
        """Any loss (the learner calls it), a snapshot sampler, and the learner's
        temperature (the rollout's)."""
        return TrainerCapabilities(
            snapshot_sampler=self.snapshot_sampler,
            learner_temperature=float(self.learner.temperature),
        )

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer of the base model (chat template included)."""
        return self._tokenizer

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt_tokens`` from the current adapter, in one
        completions request (the server batches it with every other request in flight)."""
        if self.client is None or self.adapter is None:
            raise RuntimeError("the vllm model provider is closed")
        prompt = check_request(
            prompt_tokens,
            num_samples,
            params,
            vocab_size=self.vocab_size,
            context_length=self.max_model_len,
            context="the vLLM server's context (model.vllm.max_model_len)",
        )
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
        adapter = self.pinned or self.adapter
        return await self.client.complete(adapter.name, prompt, num_samples, params, max_tokens)

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        return self.learner.forward_backward(datums, loss_fn, loss_scale)

    def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """The learner's AdamW step, then the new adapter goes to the server."""
        metrics = dict(self.learner.optim_step(adam))
        metrics["adapter_sync_s"] = self.publish_adapter()
        return metrics

    def save_state(self, path: str) -> None:
        self.learner.save_state(path)

    def load_state(self, path: str) -> None:
        self.learner.load_state(path)
        self.pinned = None  # the loaded weights are the newest: sample them
        if self.client is not None:
            self.publish_adapter()

    def close(self) -> None:
        """Unload this run's adapter (a server that outlives the run keeps no trace), stop
        a launched server, close the HTTP pool and remove the temporary folder."""
        try:
            if self.client is not None:
                if self.adapter is not None and self.server is None:
                    self._drop(self.adapter)
                    for old in self._retired:
                        self._drop(old)
                self.client.close()
        finally:
            self.client, self.adapter = None, None
            try:
                if self.server is not None:
                    self.server.stop()
                    if not self.keep_server_log:
                        self.server.log_path.unlink(missing_ok=True)
            finally:
                shutil.rmtree(self._workdir, ignore_errors=True)


def _served_path(base_model: str) -> str:
    """The model folder a launched server loads (``builtin:`` assets resolved here)."""
    from searchr1.kit.gguf import model_path

    return model_path(base_model)


def _base_max_model_len(models: list[dict[str, Any]], where: str) -> int:
    """The base model's context from ``GET /v1/models`` (adapters list a ``parent``)."""
    for card in models:
        if not card.get("parent") and card.get("max_model_len"):
            return int(card["max_model_len"])
    raise VllmError(f"the vLLM server at {where} lists no base model with a max_model_len")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the server starts, SIGTERM raises SystemExit instead of killing the trainer at
    once, so the launched server is stopped on the way out."""

    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
