"""``VllmModelProvider``: vLLM servers' sampling composed with the local learner.

Created once per run by the ``vllm`` factory (``[model] provider = "vllm"``) through
:meth:`VllmModelProvider.from_config`. Training is the local provider's own
:class:`~searchr1.plugins.local_model.learner.Learner` on the model
:func:`~searchr1.plugins.local_model.provider.load_lora_model` loads (same LoRA, optimizer,
checkpoints and resume, and the learner's sampler/learner mismatch metrics); :meth:`sample`
goes to a server.

There are one or more servers (``[model.vllm] api_base``, ``api_bases``, or ``servers``
launched ones), numbered 0, 1, ... Each trajectory group is sent to one of them (the least
busy when its first request comes, then every later turn of the group goes there too, so its
prompt stays in that server's prefix cache), and with several servers each one's
sampler/learner mismatch is logged as ``mismatch/server<k>/*`` (the group's datums are traced
back to it through ``trajectory_id``).

The policy every server samples from is always the trainer's current adapter: at start, after
each :meth:`optim_step` and after :meth:`load_state`, the adapter is saved into a new folder
under ``adapters_dir``, loaded under a new name (``searchr1-<run token>-<version>``; a new name,
so no cached prefix computed with older weights is reused) into every server at once and
checked in each one's model list; only then does sampling switch to it, and the previous one
is unloaded everywhere and its folder removed. A server that refuses it, does not list it, or
later answers without it is an error naming that server. The LoRA B matrices start at zero,
so version 0 samples exactly the base.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.errors import RemoteError
from searchr1.core.logs import get_logger
from searchr1.core.step_metrics import merge_train_metrics
from searchr1.core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    SampledSequence,
    SamplingParams,
    TrainerCapabilities,
)
from searchr1.kit.gguf import model_path
from searchr1.plugins.local_model.learner import Learner
from searchr1.plugins.local_model.provider import LocalSettings, load_lora_model, make_learner
from searchr1.plugins.local_model.sample_request import check_request
from searchr1.plugins.vllm_model.client import VllmClient, VllmError
from searchr1.plugins.vllm_model.server import (
    VllmServer,
    free_port,
    server_command,
    server_gpus,
    visible_gpus,
    wait_ready,
)
from searchr1.plugins.vllm_model.settings import VllmSettings, settings_problems

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

log = get_logger()

#: groups whose server is remembered (a few steps' worth even at 512 questions a step)
ROUTES_KEPT = 1 << 15


@dataclass(frozen=True)
class _Adapter:
    name: str
    local_dir: Path


class VllmModelProvider:
    """The ``vllm`` provider's :class:`~searchr1.core.types.Sampler` (on the vLLM servers)
    and :class:`~searchr1.core.types.Trainer` (the local learner, with its declared
    capabilities: any loss, a snapshot sampler that pins one served adapter, the learner's
    temperature)."""

    adapter: _Adapter | None = None
    #: the adapter pipelined steps sample on (None: always the newest, ``adapter``)
    pinned: _Adapter | None = None
    max_model_len: int = 0
    keep_server_log: bool = False

    def __init__(self, learner: Learner, tokenizer: Any) -> None:
        """``learner`` trains the peft model whose adapter the servers sample with."""
        self.learner = learner
        #: the Hugging Face tokenizer of the base model (chat template included)
        self.tokenizer = tokenizer
        self._token = secrets.token_hex(3)
        self._version = 0
        self._retired: list[_Adapter] = []  # replaced but maybe still sampled (pinned)
        self._retired_lock = threading.Lock()
        self._workdir = Path(tempfile.mkdtemp(prefix="searchr1-vllm-"))
        #: one per server, in the order of the settings (server0, server1, ...)
        self.clients: list[VllmClient] = []
        #: the servers this provider launched (none when they already ran)
        self.servers: list[VllmServer] = []
        self._routes: OrderedDict[str, int] = OrderedDict()  # group_id -> server
        self._in_flight: list[int] = []
        self._next = 0  # round-robin among equally busy servers

    @classmethod
    def from_config(cls, config: Config) -> VllmModelProvider:
        """Check ``[model.vllm]``, load the model for training (``[model.local]``'s device,
        dtype and learner settings), reach or launch the servers, and publish the initial
        adapter."""
        from searchr1.core.config_validate import plugin_settings
        from searchr1.core.errors import ConfigError

        settings = plugin_settings(config, "model", "vllm", VllmSettings)
        problems = settings_problems(settings, config.model.api_base)
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
        api_base = config.model.api_base
        api_bases = list(settings.api_bases) or ([api_base] if api_base else [])
        if not api_bases:
            api_bases = self._launch(config, settings)
        several = len(api_bases) > 1
        for k, api_base in enumerate(api_bases):
            self.clients.append(
                VllmClient(
                    api_base,
                    request_timeout_s=settings.request_timeout_s,
                    max_connections=settings.max_connections,
                    # A server started with --api-key wants it; [model] api_key holds it (a secret).
                    api_key=config.model.api_key if not self.servers else "",
                    label=f"vLLM server{k}" if several else "",
                )
            )
        self._in_flight = [0] * len(self.clients)
        waited = 0.0
        for k, client in enumerate(self.clients):
            waited = max(
                waited,
                wait_ready(
                    client.healthy,
                    where=client.api_base,
                    timeout_s=settings.startup_timeout_s,
                    server=self.servers[k] if self.servers else None,
                ),
            )
        self.max_model_len = min(
            _base_max_model_len(client.models(), client.name) for client in self.clients
        )
        self.publish_adapter()
        log.info(
            "vllm_ready",
            api_bases=[client.api_base for client in self.clients],
            launched=bool(self.servers),
            ready_after_s=round(waited, 1),
            max_model_len=self.max_model_len,
            adapter=self.adapter.name if self.adapter else None,
        )

    def _launch(self, config: Config, settings: VllmSettings) -> list[str]:
        """Start ``settings.servers`` servers (each on its own GPUs when there are GPUs);
        their addresses. They load in parallel; :meth:`_connect` waits for each."""
        gpus = server_gpus(
            settings.servers, settings.server_args, visible_gpus() if settings.servers > 1 else []
        )
        api_bases = []
        for k, devices in enumerate(gpus):
            port = free_port()
            command = server_command(
                str(Path(settings.python).expanduser()),
                model=model_path(config.model.base_model, config.assets),  # builtin: resolved
                port=port,
                dtype=str(next(self.learner.model.parameters()).dtype).removeprefix("torch."),
                max_model_len=settings.max_model_len
                or min(config.rollout.max_trajectory_tokens, self.learner.context_length),
                lora_rank=config.lora.rank,
                seed=config.run.seed,
                extra=settings.server_args,
            )
            # Outside the temporary folder: a failed start keeps it (the error names it);
            # a clean close removes it.
            suffix = f"-{k}" if settings.servers > 1 else ""
            log_path = Path(tempfile.gettempdir()) / f"searchr1-vllm-{self._token}{suffix}.log"
            env = {"CUDA_VISIBLE_DEVICES": devices} if devices else None
            self.servers.append(VllmServer.launch(command, log_path, env=env))
            api_bases.append(f"http://127.0.0.1:{port}")
        return api_bases

    # ------------------------------------------------------------------ adapter sync

    def publish_adapter(self) -> float:
        """Save the current adapter, load it into every server under a new name (checked in
        each one's model list), unload the old one; returns the seconds it took. Sampling
        uses the new one from now on."""
        if not self.clients:
            raise RuntimeError("the vllm model provider is closed")
        t0 = time.perf_counter()
        name = f"searchr1-{self._token}-{self._version}"
        local_dir = self._adapters / name
        server_path = f"{self._server_adapters.rstrip('/')}/{name}"
        with self.learner.model_lock:
            self.learner.model.save_pretrained(str(local_dir))
        try:
            self._load_everywhere(name, server_path)
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

    def _load_everywhere(self, name: str, path: str) -> None:
        """Load adapter ``name`` into every server at once; when any fails, unload it from
        the others and raise the failures (each names its server)."""
        futures = [c.submit(c.load_adapter_async(name, path)) for c in self.clients]
        failures: list[BaseException] = []
        loaded: list[VllmClient] = []
        for client, future in zip(self.clients, futures, strict=True):
            try:
                future.result()
                loaded.append(client)
            except BaseException as exc:  # every server's answer is read before raising
                failures.append(exc)
        if not failures:
            return
        for client in loaded:
            try:
                client.unload_adapter(name)
            except (VllmError, RemoteError) as exc:
                log.warning("vllm_unload_failed", adapter=name, error=str(exc))
        first = failures[0]
        if len(failures) == 1 or not all(isinstance(f, VllmError | RemoteError) for f in failures):
            raise first
        raise type(first)("; ".join(str(f) for f in failures)) from first

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
        futures = [c.submit(c.unload_adapter_async(adapter.name)) for c in self.clients]
        for future in futures:
            try:
                future.result()
            except (VllmError, RemoteError) as exc:  # a leftover adapter costs memory only
                log.warning("vllm_unload_failed", adapter=adapter.name, error=str(exc))
        shutil.rmtree(adapter.local_dir, ignore_errors=True)

    # ------------------------------------------------------------------ routing

    def server_of(self, group_id: str) -> int | None:
        """The server that sampled group ``group_id`` (None: not one of the recent groups)."""
        return self._routes.get(group_id)

    def _route(self, group_id: str) -> int:
        """A group's server: where its first request went, else the server with the fewest
        requests in flight (round-robin among equals)."""
        if len(self.clients) == 1:
            return 0
        if group_id:
            known = self._routes.get(group_id)
            if known is not None:
                self._routes.move_to_end(group_id)
                return known
        count = len(self.clients)
        k = min(range(count), key=lambda i: (self._in_flight[i], (i - self._next) % count))
        self._next = (k + 1) % count
        if group_id:
            self._routes[group_id] = k
            if len(self._routes) > ROUTES_KEPT:
                self._routes.popitem(last=False)
        return k

    # ------------------------------------------------------------------ Sampler, Trainer

    @property
    def capabilities(self) -> TrainerCapabilities:
        """Any loss (the learner calls it), a snapshot sampler, the local learner's KL
        reference, and the learner's temperature (the rollout's)."""
        return TrainerCapabilities(
            snapshot_sampler=self.snapshot_sampler,
            kl_reference=self.learner.pin_reference,
            learner_temperature=float(self.learner.temperature),
        )

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt_tokens`` from the current adapter, in one
        completions request to the group's server (which batches it with every other request
        in flight)."""
        if not self.clients or self.adapter is None:
            raise RuntimeError("the vllm model provider is closed")
        prompt = check_request(
            prompt_tokens,
            num_samples,
            params,
            vocab_size=self.learner.vocab_size,
            context_length=self.max_model_len,
            context="the vLLM server's context (model.vllm.max_model_len)",
        )
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
        adapter = self.pinned or self.adapter
        k = self._route(params.group_id)
        self._in_flight[k] += 1
        try:
            return await self.clients[k].complete(
                adapter.name, prompt, num_samples, params, max_tokens
            )
        finally:
            self._in_flight[k] -= 1

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Awaitable[ForwardBackwardResult]:
        """The learner's ``forward_backward``, queued in its worker thread. With several
        servers the datums go to it per server (the loss is a sum over datums, so the
        gradient is the same), and each part's ``mismatch/*`` is also reported as
        ``mismatch/server<k>/*``; the parts' metrics are merged as the loop merges
        micro-batches (:func:`merge_train_metrics`)."""
        if len(self.clients) <= 1:
            return asyncio.wrap_future(self.learner.submit(datums, loss_fn, loss_scale))
        parts: dict[int | None, list[Datum]] = {}
        for d in datums:
            group = (d.trajectory_id or "").rpartition("/")[0]
            parts.setdefault(self.server_of(group) if group else None, []).append(d)
        queued = [
            (k, asyncio.wrap_future(self.learner.submit(part, loss_fn, loss_scale)))
            for k, part in sorted(parts.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
        ]
        return asyncio.ensure_future(_per_server(queued))

    async def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """The learner's AdamW step, then the new adapter goes to every server (both in the
        learner's worker thread)."""
        return await asyncio.wrap_future(self.learner.worker.submit(self._step, adam))

    def _step(self, adam: AdamParams) -> Mapping[str, float]:
        metrics = dict(self.learner.optim_step(adam))
        metrics["adapter_sync_s"] = self.publish_adapter()
        return metrics

    def save_state(self, path: str) -> None:
        self.learner.save_state(path)

    def load_state(self, path: str) -> None:
        self.learner.load_state(path)
        self.pinned = None  # the loaded weights are the newest: sample them
        if self.clients:
            self.publish_adapter()

    def close(self) -> None:
        """Unload this run's adapters (a server that outlives the run keeps no trace), stop
        the launched servers, close the HTTP pools and remove the temporary folder."""
        try:
            if self.clients and self.adapter is not None and not self.servers:
                for adapter in (self.adapter, *self._retired):
                    self._drop(adapter)
        finally:
            self.learner.worker.shutdown()
            clients, self.clients, self.adapter = self.clients, [], None
            try:
                for client in clients:
                    client.close()
            finally:
                try:
                    for server in self.servers:
                        server.stop()
                        if not self.keep_server_log:
                            server.log_path.unlink(missing_ok=True)
                finally:
                    shutil.rmtree(self._workdir, ignore_errors=True)


async def _per_server(
    queued: Sequence[tuple[int | None, Awaitable[ForwardBackwardResult]]],
) -> ForwardBackwardResult:
    """One result of the per-server parts (``k``: the server, None for datums of no known
    group), each part's ``mismatch/*`` also as ``mismatch/server<k>/*``."""
    loss, metrics = 0.0, []
    for k, part in queued:
        result = await part
        loss += result.loss
        metrics.append(dict(result.metrics))
        if k is not None:
            metrics[-1].update(
                {
                    f"mismatch/server{k}/{key.removeprefix('mismatch/')}": value
                    for key, value in result.metrics.items()
                    if key.startswith("mismatch/")
                }
            )
    return ForwardBackwardResult(loss=loss, metrics=merge_train_metrics(metrics))


def _base_max_model_len(models: list[dict[str, Any]], server: str) -> int:
    """The base model's context from ``GET /v1/models`` (adapters list a ``parent``)."""
    for card in models:
        if not card.get("parent") and card.get("max_model_len"):
            return int(card["max_model_len"])
    raise VllmError(f"{server} lists no base model with a max_model_len")


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
