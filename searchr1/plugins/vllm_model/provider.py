"""``VllmModelProvider``: vLLM servers' sampling composed with the local learner."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.kit.learner.learner import Learner
from searchr1.kit.learner.loading import LocalSettings, load_lora_model, make_learner
from searchr1.kit.learner.requests import check_request
from searchr1.kit.learner.state import ADAPTER_ONLY
from searchr1.kit.learner.trainer import LearnerTrainer, Publish
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
from searchr1.sdk import (
    Datum,
    ForwardBackwardResult,
    LossFn,
    RemoteError,
    SampledSequence,
    SamplingParams,
    SearchR1Error,
    World,
    get_logger,
    merge_train_metrics,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config

log = get_logger()

#: groups whose server is remembered (a few steps' worth even at 512 questions a step)
ROUTES_KEPT = 1 << 15

T = TypeVar("T")


@dataclass(frozen=True)
class _Adapter:
    name: str
    local_dir: Path


class VllmModelProvider(LearnerTrainer, Publish):
    """The ``vllm`` provider's :class:`~searchr1.core.types.Sampler` (on the vLLM servers)
    and :class:`~searchr1.core.types.Trainer`: the local learner's
    :class:`~searchr1.kit.learner.trainer.LearnerTrainer`, whose publish step saves
    the adapter and loads it into every server (a snapshot sampler pins one served adapter)."""

    adapter: _Adapter | None = None
    #: the adapter pipelined steps sample on (None: always the newest, ``adapter``)
    pinned: _Adapter | None = None
    _config: Config
    _settings: VllmSettings
    max_model_len: int = 0
    keep_server_log: bool = False

    def __init__(self, learner: Learner, tokenizer: Any, world: World | None = None) -> None:
        """``learner`` trains the peft model whose adapter the servers sample with;
        ``world``: this process's place in a torchrun job (default: alone)."""
        LearnerTrainer.__init__(self, learner, publish=self)
        self.world = world or World()
        #: the Hugging Face tokenizer of the base model (chat template included)
        self.tokenizer = tokenizer
        self._token = secrets.token_hex(3)
        self._version = 0
        self._retired: list[_Adapter] = []  # replaced but maybe still sampled (pinned)
        #: load_state changed the weights where it could not publish them (a rank > 0, not
        #: connected): published, or awaited, before the next sample, pin or step
        self._loaded = False
        self._publishing = asyncio.Lock()
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
        """Check ``[model.vllm]`` and load the model for training (``[model.local]``'s device,
        dtype and learner settings); :meth:`connect` then reaches or launches the servers."""
        from searchr1.sdk import ConfigError, plugin_settings

        settings = plugin_settings(config, "model", "vllm", VllmSettings)
        local = plugin_settings(config, "model", "local", LocalSettings)
        world = World.from_env()
        problems = settings_problems(settings, config.model.api_base)
        problems += job_problems(settings, config.model.api_base, local, world)
        if problems:
            raise ConfigError([f"{config.source}: {problem}" for problem in problems])
        # top_p < 1 is announced before the run (the factory's advise, vllm_model/__init__.py)
        model, tokenizer, device, _ = load_lora_model(config, local)
        lock = threading.Lock()
        learner = make_learner(model, tokenizer, device, lock, config.model.temperature, local)
        provider = cls(learner, tokenizer, world)
        provider._config, provider._settings = config, settings
        return provider

    async def connect(self) -> None:
        """Reach or launch the servers, wait until each is ready, and publish the initial
        adapter; in the event loop that later calls use. On a failure everything is closed
        (a launched server's log is kept: the error names it)."""
        with _sigterm_raises():
            try:
                await self._connect(self._config, self._settings)
            except BaseException:
                self.keep_server_log = True
                try:
                    await self.disconnect()
                finally:
                    self.close()
                raise

    async def _connect(self, config: Config, settings: VllmSettings) -> None:
        self._adapters = Path(settings.adapters_dir) if settings.adapters_dir else self._workdir
        self._server_adapters = settings.server_adapters_dir or str(self._adapters)
        self._adapters.mkdir(parents=True, exist_ok=True)
        api_base = config.model.api_base
        given = list(settings.api_bases) or ([api_base] if api_base else [])
        # Rank 0 (or the one process) reaches or launches the servers and publishes version 0;
        # the other ranks then talk to the same servers under the same adapter names.
        reached = await self._on_rank0(lambda: self._reach(config, settings, given))
        if not self.world.main:
            api_bases, launched, self._token, self.max_model_len = reached
            key = "" if launched else config.model.api_key
            self._make_clients(api_bases, settings, key, launched_by_rank0=launched)
            self.adapter = self._follow()

    async def _reach(
        self, config: Config, settings: VllmSettings, api_bases: list[str]
    ) -> tuple[list[str], bool, str, int]:
        """Launch the servers unless ``api_bases`` names running ones, wait for each, publish
        the initial adapter; what the other ranks need to use them (addresses, whether they
        were launched, the run token, the context)."""
        launched = not api_bases
        if launched:
            api_bases = self._launch(config, settings)
        # A server started with --api-key wants it; [model] api_key holds it (a secret).
        self._make_clients(api_bases, settings, "" if launched else config.model.api_key)
        waited = 0.0
        for k, client in enumerate(self.clients):
            waited = max(
                waited,
                await wait_ready(
                    client.readiness,
                    where=client.api_base,
                    timeout_s=settings.startup_timeout_s,
                    server=self.servers[k] if self.servers else None,
                ),
            )
        for client, server in zip(self.clients, self.servers, strict=False):
            client.server = server  # ready: from now on its death is reported as such
        self.max_model_len = min(
            [_base_max_model_len(await client.models(), client.name) for client in self.clients]
        )
        await self.publish_adapter()
        log.info(
            "vllm_ready",
            api_bases=[client.api_base for client in self.clients],
            launched=bool(self.servers),
            ready_after_s=round(waited, 1),
            max_model_len=self.max_model_len,
            adapter=self.adapter.name if self.adapter else None,
            world_size=self.world.size,
        )
        return api_bases, launched, self._token, self.max_model_len

    def _make_clients(
        self,
        api_bases: Sequence[str],
        settings: VllmSettings,
        key: str,
        *,
        launched_by_rank0: bool = False,
    ) -> None:
        """One client per server, named server0, server1, ... when there are several;
        ``launched_by_rank0``: on another rank of a torchrun job whose rank 0 launched them."""
        several = len(api_bases) > 1
        self.clients = [
            VllmClient(
                api_base,
                request_timeout_s=settings.request_timeout_s,
                max_connections=settings.max_connections,
                api_key=key,
                label=f"vLLM server{k}" if several else "",
                launched_by_rank0=launched_by_rank0,
            )
            for k, api_base in enumerate(api_bases)
        ]
        self._in_flight = [0] * len(self.clients)

    async def _on_rank0(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` done by rank 0 (the one process: just done), its result on every rank;
        under torchrun a collective, so no rank goes on before rank 0 is done. A failure on
        rank 0 is raised on every rank: its own error there, its message with the same exit
        code on the others."""
        if self.world.main:
            try:
                result = await work()
            except BaseException as exc:
                if self.world.size > 1:
                    code = exc.exit_code if isinstance(exc, SearchR1Error) else 1
                    self.world.broadcast((False, (f"{exc}", code)))
                raise
            self.world.broadcast((True, result))  # one process: nothing to tell
            return result
        ok, value = self.world.broadcast((False, None))
        if not ok:
            message, code = value
            failed = SearchR1Error(message)
            failed.exit_code = code
            raise failed
        return value  # type: ignore[no-any-return]

    def _next_name(self) -> str:
        """The next adapter version's name; every rank counts the versions alike."""
        name = f"searchr1-{self._token}-{self._version}"
        self._version += 1
        return name

    def _follow(self) -> _Adapter:
        """A rank > 0: the version rank 0 has just published (it writes and removes the
        folders; this rank only samples by name)."""
        name = self._next_name()
        return _Adapter(name, self._adapters / name)

    def _launch(self, config: Config, settings: VllmSettings) -> list[str]:
        """Start ``settings.servers`` servers (each on its own GPUs when there are GPUs);
        their addresses. They load in parallel; :meth:`_connect` waits for each."""
        # Under torchrun the job's ranks on this node train on its first GPUs (cuda:LOCAL_RANK)
        learners = _local_world_size() if self.world.size > 1 else 0
        gpus = server_gpus(
            settings.servers,
            settings.server_args,
            visible_gpus() if settings.servers > 1 or learners else [],
            learners=learners,
        )
        api_bases = []
        for k, devices in enumerate(gpus):
            port = free_port()
            command = server_command(
                str(Path(settings.python).expanduser()),
                # what the learner loaded: a builtin: or .gguf model's folder, and a hub id's
                # cached folder when the hub is out of reach (the server must not ask it)
                model=self.learner.model.get_base_model().config.name_or_path,
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

    async def publish_adapter(self) -> float:
        """Save the current adapter (in the learner's worker, between its steps), load it
        into every server under a new name (checked in each one's model list), unload the old
        one; returns the seconds it took. Sampling uses the new one from now on."""
        t0 = time.perf_counter()
        saved = await asyncio.wrap_future(self.learner.worker.submit(self._save_adapter))
        await self._publish(saved)
        return time.perf_counter() - t0

    def _save_adapter(self) -> _Adapter:
        """Write the current adapter into a folder of its own, under a new name."""
        name = self._next_name()
        adapter = _Adapter(name, self._adapters / name)
        with self.learner.model_lock:
            self.learner.model.save_pretrained(str(adapter.local_dir), **ADAPTER_ONLY)
        return adapter

    async def _publish(self, saved: _Adapter) -> None:
        """Load the saved adapter everywhere, then sample it and drop the one it replaces."""
        if not self.clients:
            raise RuntimeError("the vllm model provider is closed")
        try:
            await _load_into(
                self.clients, saved.name, f"{self._server_adapters.rstrip('/')}/{saved.name}"
            )
        except BaseException:
            shutil.rmtree(saved.local_dir, ignore_errors=True)
            raise
        old, self.adapter = self.adapter, saved
        self._loaded = False
        if old is not None and old is self.pinned:
            self._retired.append(old)  # pipelined steps: a rollout may still sample it
        elif old is not None:
            await self._drop(old)

    async def _current(self) -> _Adapter:
        """The adapter to sample: the pinned one, else the newest; weights that
        :meth:`load_state` loaded are published first."""
        if self._loaded:
            async with self._publishing:  # one publish, however many samples ask at once
                if self._loaded and self.world.main:
                    await self.publish_adapter()
                elif self._loaded:
                    await self._await_published()
        adapter = self.pinned or self.adapter
        if not self.clients or adapter is None:
            raise RuntimeError("the vllm model provider is not connected, or closed")
        return adapter

    async def _await_published(self) -> None:
        """A rank > 0 after :meth:`load_state`: wait until every server lists the version rank
        0 publishes in its :meth:`load_state`, then sample it."""
        adapter = self._follow()
        timeout_s = self._settings.request_timeout_s
        for client in self.clients:
            deadline = time.monotonic() + timeout_s
            while not any(card.get("id") == adapter.name for card in await client.models()):
                if time.monotonic() > deadline:
                    raise VllmError(
                        f"{client.name} does not list LoRA adapter {adapter.name!r}, which rank "
                        f"0 of this torchrun job publishes after loading the checkpoint, "
                        f"{timeout_s:g} s later (model.vllm.request_timeout_s); rank 0's output "
                        f"says why"
                    )
                await asyncio.sleep(0.2)
        self.adapter = adapter
        self._loaded = False

    async def pin(self) -> None:
        """Pipelined steps (``train.max_staleness > 0``): sample on the newest published
        adapter until the next call, and unload the adapters no rollout samples any more."""
        await self._current()  # weights that load_state loaded are published first
        self.pinned = self.adapter
        retired, self._retired = self._retired, []
        for old in retired:
            if old is not self.pinned:
                await self._drop(old)

    async def _drop(self, adapter: _Adapter) -> None:
        await _unload_from(self.clients, adapter.name)
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

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt_tokens`` from the current adapter, in one
        completions request to the group's server (which batches it with every other request
        in flight)."""
        adapter = await self._current()
        prompt = check_request(
            prompt_tokens,
            num_samples,
            params,
            vocab_size=self.learner.vocab_size,
            context_length=self.max_model_len,
            context="the vLLM server's context (model.vllm.max_model_len)",
        )
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
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
            return await super().forward_backward(datums, loss_fn, loss_scale)
        parts: dict[int | None, list[Datum]] = {}
        for d in datums:
            group = (d.trajectory_id or "").rpartition("/")[0]
            parts.setdefault(self.server_of(group) if group else None, []).append(d)
        queued = [
            (k, asyncio.wrap_future(self.learner.submit(part, loss_fn, loss_scale)))
            for k, part in sorted(parts.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
        ]
        return asyncio.ensure_future(_per_server(queued))

    # the publish step: under torchrun every rank steps (the gradients summed over the ranks),
    # rank 0 alone saves and loads the adapter, and every rank returns once every server
    # serves it

    def save_weights(self) -> tuple[_Adapter | None, float]:
        """The new adapter saved (rank 0), and the seconds it took."""
        t0 = time.perf_counter()
        saved = self._save_adapter() if self.world.main else None
        return saved, time.perf_counter() - t0

    async def publish(self, saved: tuple[_Adapter | None, float]) -> Mapping[str, float]:
        """Load the saved adapter into every server; ``adapter_sync_s``, the save and load."""
        adapter, saving_s = saved
        t0 = time.perf_counter()
        if adapter is not None:
            await self._on_rank0(lambda: self._publish(adapter))
        else:
            await self._on_rank0(_nothing)  # waits for rank 0's publish
            self.adapter = self._follow()
        return {"adapter_sync_s": saving_s + time.perf_counter() - t0}

    async def after_load(self) -> None:
        """Connected, rank 0 (or the one process) publishes the loaded adapter to every server
        before :meth:`load_state` returns, another rank samples it once every server lists it."""
        self.pinned = None  # the loaded weights are the newest: sample them
        if self.world.main and self.clients:
            # Now, not at rank 0's first sample: the other ranks wait for this version
            # before theirs, and rank 0 may have no share of the next step to sample.
            await self.publish_adapter()
        else:
            self._loaded = True  # published (or awaited) before the next sample, pin or step

    async def disconnect(self) -> None:
        """Unload this run's adapters (a server that outlives the run keeps no trace) and
        close the HTTP pools, in the event loop that used them."""
        clients = self.clients
        try:
            # rank 0 loaded them, rank 0 unloads them
            if clients and self.adapter is not None and not self.servers and self.world.main:
                for adapter in (self.adapter, *self._retired):
                    await self._drop(adapter)
        finally:
            self.clients, self.adapter, self._retired = [], None, []
            for client in clients:
                await client.aclose()

    def close(self) -> None:
        """Stop the learner's worker and the launched servers, and remove the temporary
        folder (after :meth:`disconnect`; safe to call twice)."""
        super().close()
        self.clients, self.adapter = [], None
        servers, self.servers = self.servers, []
        try:
            for server in servers:
                died = server.exited() is not None  # its log says why: an error names it
                server.stop()
                if not (self.keep_server_log or died):
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


async def _load_into(clients: Sequence[VllmClient], name: str, path: str) -> None:
    """Load adapter ``name`` into every server at once; when any fails, unload it from
    the others and raise the failures (each names its server)."""
    answers = await asyncio.gather(
        *(c.load_adapter(name, path) for c in clients), return_exceptions=True
    )
    failures = [a for a in answers if isinstance(a, BaseException)]
    if not failures:
        return
    for client, answer in zip(clients, answers, strict=True):
        if isinstance(answer, BaseException):
            continue
        try:
            await client.unload_adapter(name)
        except (VllmError, RemoteError) as exc:
            log.warning("vllm_unload_failed", adapter=name, error=str(exc))
    first = failures[0]
    if len(failures) == 1 or not all(isinstance(f, VllmError | RemoteError) for f in failures):
        raise first
    raise type(first)("; ".join(str(f) for f in failures)) from first


async def _unload_from(clients: Sequence[VllmClient], name: str) -> None:
    """Unload adapter ``name`` from every server; a server that cannot is only logged (a
    leftover adapter costs memory only)."""
    answers = await asyncio.gather(
        *(c.unload_adapter(name) for c in clients), return_exceptions=True
    )
    for answer in answers:
        if isinstance(answer, VllmError | RemoteError):
            log.warning("vllm_unload_failed", adapter=name, error=str(answer))
        elif isinstance(answer, BaseException):
            raise answer


async def _nothing() -> None:
    """What a rank > 0 does while rank 0 publishes (it only waits for the outcome)."""


def job_problems(s: VllmSettings, api_base: str, local: LocalSettings, world: World) -> list[str]:
    """What the ``vllm`` provider cannot do as one rank of a torchrun job of ``world``."""
    if world.size == 1:
        return []
    problems = []
    nodes_local = _local_world_size()
    if not (api_base or s.api_bases) and nodes_local != world.size:
        problems.append(
            f"model.vllm: launched servers listen on rank 0's machine only (127.0.0.1), but "
            f"this torchrun job spans several machines (WORLD_SIZE = {world.size}, "
            f"LOCAL_WORLD_SIZE = {nodes_local}): start the servers yourself and list their "
            f"addresses in model.vllm.api_bases (docs/vllm.md)"
        )
    if local.fsdp:
        problems.append(
            "model.local.fsdp = true: the vllm provider's learner keeps a whole copy of the "
            "model on each torchrun rank (FSDP is the local provider's); set it to false"
        )
    return problems


def _local_world_size() -> int:
    """How many ranks of the torchrun job run on this machine (torchrun's
    ``LOCAL_WORLD_SIZE``; the whole job when unset)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or "1")


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
