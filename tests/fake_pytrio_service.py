"""A loopback fake of the PyTRIO service, computed by the ``local`` model provider.

The real ``pytrio`` SDK talks real HTTP to it on 127.0.0.1. It speaks the two halves of the
protocol the SDK uses (as read from ``pytrio`` 0.2.x):

* the JSON **control API** under ``/api``: API-key check (``X-API-Key`` / ``Authorization:
  Bearer``), SDK bootstrap, service sessions, training runs (create, find by checkpoint URI,
  rebind for ``load_state``, renew), sampling runs (create, renew), telemetry sink;
* a per-run **actor host** under ``/actor`` that takes msgpack event envelopes
  (``POST v1/events``: ``trainer.init_run``, ``trainer.forward[_backward]``,
  ``trainer.optimize_step``, ``trainer.save_state``, ``trainer.save_weights``,
  ``trainer.end_run``), answers long polls (``GET v1/events/{id}`` with ``Prefer: wait=N``),
  heartbeats, and samples (``POST v1/sampling-runs/{id}/sample``, JSON).

Requests are parsed with the SDK's own (strict, extra-fields-forbidden) protocol models, so a
drift between what the SDK sends and what it documents fails loudly; responses are written by
hand and validated by the SDK on its side. Events run in order on one worker thread; a
resubmitted event id answers ``409 event_exists`` like the real actor, so SDK retries are
idempotent here too.

Computation: :mod:`fake_service_compute` (a ``LocalModelProvider`` per training run, another
per sampling run loaded from the saved checkpoint); the SDK's ``gradient_accumulation``
totals are accepted and ignored.

Faults: :meth:`FakePyTrio.inject` makes matching requests fail with a status (429, 5xx, 401...)
or answer late, a given number of times. :attr:`FakePyTrio.requests` records when each request
started and ended, so a test can tell which requests the SDK had in flight together.

Not faithful (the real service's behaviour is unknown here): how the real trainer normalises
a policy loss (the fake sums), checkpoint storage and TTLs, capacity queueing
(``actor_capacity_exceeded``), TLS actors, image inputs, ``dro``, prompt log-probs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import fake_service_compute as compute
import msgpack
import numpy as np

API_KEY = "sk-fake-taotoken-0123456789"


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method`` and the ``path`` regex with
    ``status`` (after ``delay`` seconds), or -- with ``status=0`` -- handle them normally but
    only after ``delay`` seconds."""

    method: str
    path: str
    status: int = 0
    times: int = 1
    delay: float = 0.0
    code: str = ""
    hits: int = 0


@dataclass
class TrainingRun:
    cuid: str
    base_model: str  # the alias the client asked for
    model_path: str  # the resolved local folder (the SDK loads its tokenizer from it)
    rank: int
    seed: int | None
    train_mlp: bool
    train_attn: bool
    train_unembed: bool
    source_checkpoint_uri: str = ""
    restore_optimizer: bool = False
    jwt: str = field(default_factory=lambda: f"actor-jwt-{uuid.uuid4().hex}")
    provider: Any = None


@dataclass
class Checkpoint:
    uri: str
    folder: Path
    run: TrainingRun


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _cuid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class _Reply(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON error body."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FakePyTrio:
    """The fake service. Use as a context manager; ``base_url`` is what ``api_base`` gets."""

    def __init__(
        self, api_key: str = API_KEY, *, sampler_cache: int = 3, policy: Any = None
    ) -> None:
        self.api_key = api_key
        #: a model provider that answers every sample instead of the run's weights (a
        #: scripted policy, for tests that need exact trajectories through the real SDK)
        self.policy = policy
        self.faults: list[Fault] = []
        self.counts: dict[str, int] = {}
        #: every request as (method, path, start, end) in time.monotonic() seconds, for tests
        #: that check which requests were in flight together
        self.requests: list[tuple[str, str, float, float]] = []
        self.sampler_cache = sampler_cache
        self._root = Path(tempfile.mkdtemp(prefix="fake-pytrio-"))
        self._lock = threading.RLock()
        self._compute_lock = threading.Lock()  # one model computation at a time
        self._sessions: set[str] = set()
        self._runs: dict[str, TrainingRun] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._samplers: dict[str, tuple[str, Any]] = {}  # cuid -> (jwt, provider)
        self._events: dict[str, dict[str, Any]] = {}
        self._event_done = threading.Condition(self._lock)
        self._queue: queue.Queue[tuple[TrainingRun, Any] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="fake-pytrio-actor", daemon=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakePyTrio:
        self._worker.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._queue.put(None)
        for _, provider in self._samplers.values():
            provider.close()
        for run in self._runs.values():
            if run.provider is not None:
                run.provider.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def inject(self, method: str, path: str, status: int = 0, **kwargs: Any) -> Fault:
        fault = Fault(method=method, path=path, status=status, **kwargs)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def count(self, what: str) -> int:
        return self.counts.get(what, 0)

    def _bump(self, what: str) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.hits < fault.times and fault.method == method:
                    if re.search(fault.path, path):
                        fault.hits += 1
                        return fault
        return None

    # ------------------------------------------------------------------ control API

    def control(
        self, method: str, path: str, query: dict[str, str], body: Any, headers: Any
    ) -> Any:
        if path == "/api/telemetry/event":
            return {}
        key = headers.get("X-API-Key") or headers.get("Authorization", "").removeprefix("Bearer ")
        if key != self.api_key:
            raise _Reply(401, "unauthorized", "Invalid API key")
        route = path.removeprefix("/api/")
        if route == "openapi/v1/api-key/verify":
            return {
                "api_key_tid": "tid_fake",
                "api_key_name": "fake",
                "user_cuid": "user_fake",
                "username": "fake-user",
                "display_name": "Fake User",
                "workspace_cuid": "ws_fake",
                "workspace_name": "fake",
                "workspace_type": "personal",
                "expires_at": None,
            }
        if route == "sdk/bootstrap":
            version = query.get("sdk_version", "")
            return {
                "compatibility": {"status": "compatible", "sdk_version": version},
                "notices": [],
            }
        if route == "models":
            return {"items": [], "total": 0, "limit": 100, "offset": 0}
        if method == "POST" and route == "openapi/v1/service-sessions":
            sid = _cuid("ss")
            self._sessions.add(sid)
            return {
                "service_session_cuid": sid,
                "workspace_cuid": "ws_fake",
                "status": "ACTIVE",
                "created_at": _now(),
            }
        m = re.fullmatch(r"openapi/v1/service-sessions/([^/]+)/(close|renew)", route)
        if m and method == "POST":
            self._bump(f"session_{m.group(2)}")
            return {
                "service_session_cuid": m.group(1),
                "workspace_cuid": "ws_fake",
                "status": "ENDED",
                "updated_at": _now(),
            }
        m = re.fullmatch(r"openapi/v1/service-sessions/([^/]+)/training-runs", route)
        if m and method == "POST":
            return self._create_training_run(m.group(1), body)
        m = re.fullmatch(r"openapi/v1/service-sessions/([^/]+)/training-runs/([^/]+)", route)
        if m and method == "PATCH":
            return self._rebind_training_run(m.group(2), body)
        if route == "openapi/v1/training-runs/by-checkpoint-uri":
            ckpt = self._checkpoint(query.get("checkpoint_uri", ""))
            run = ckpt.run
            return {
                "base_model": run.base_model,
                "lora_rank": run.rank,
                "seed": run.seed,
                "train_mlp": run.train_mlp,
                "train_attn": run.train_attn,
                "train_unembed": run.train_unembed,
            }
        m = re.fullmatch(r"openapi/v1/(training|sampling)-runs/([^/]+)/renew", route)
        if m and method == "POST":
            return self._renew(m.group(1), m.group(2))
        m = re.fullmatch(r"openapi/v1/service-sessions/([^/]+)/sampling-runs", route)
        if m and method == "POST":
            return self._create_sampling_run(m.group(1), body)
        raise _Reply(404, "not_found", f"no route {method} {path}")

    def _actor_info(self) -> dict[str, Any]:
        return {
            "actor_cuid": "actor_fake",
            "endpoint": f"{self.base_url}/actor",
            "connect_mode": "direct",
            "tls_enabled": False,
        }

    @staticmethod
    def _jwt(token: str) -> dict[str, Any]:
        return {"token": token, "expires_at": (datetime.now(UTC) + timedelta(hours=2)).isoformat()}

    @staticmethod
    def _capability() -> dict[str, Any]:
        return {"max_batch_size": None, "max_tokens_per_request": None, "max_seq_len": None}

    def _resolve_model(self, name: str) -> str:
        try:
            return compute.resolve_model(name)
        except compute.ModelNotFound as exc:
            status = 400 if not name else 404
            code = "invalid_request" if not name else "model_not_found"
            raise _Reply(status, code, str(exc)) from None

    def _create_training_run(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        from pytrio.protocol.control.training_run.create import TrainingRunCreateRequest

        req = TrainingRunCreateRequest.model_validate(body)
        if req.source_checkpoint_uri:
            source = self._checkpoint(req.source_checkpoint_uri).run
            alias, path = source.base_model, source.model_path
        else:
            alias, path = req.base_model, self._resolve_model(req.base_model)
        run = TrainingRun(
            cuid=_cuid("tr"),
            base_model=alias,
            model_path=path,
            rank=req.lora_rank,
            seed=req.seed,
            train_mlp=req.train_mlp,
            train_attn=req.train_attn,
            train_unembed=req.train_unembed,
            source_checkpoint_uri=req.source_checkpoint_uri,
            restore_optimizer=req.restore_optimizer,
        )
        with self._lock:
            self._runs[run.cuid] = run
        return {
            "training_run_cuid": run.cuid,
            "service_session_cuid": session,
            "workspace_cuid": "ws_fake",
            "status": "CREATED",
            "run_index": len(self._runs),
            "model_spec_cuid": "spec_fake",
            "model_alias": alias,
            "model_id": path,
            "trainer": self._capability(),
            "actor": self._actor_info(),
            "actor_jwt": self._jwt(run.jwt),
            "created_at": _now(),
        }

    def _rebind_training_run(self, run_cuid: str, body: dict[str, Any]) -> dict[str, Any]:
        from pytrio.protocol.control.training_run.update import TrainingRunUpdateRequest

        req = TrainingRunUpdateRequest.model_validate(body)
        run = self._runs.get(run_cuid)
        if run is None:
            raise _Reply(404, "not_found", f"training run {run_cuid} not found")
        self._checkpoint(req.source_checkpoint_uri)
        run.source_checkpoint_uri = req.source_checkpoint_uri
        run.restore_optimizer = req.restore_optimizer
        return {
            "source_checkpoint_uri": req.source_checkpoint_uri,
            "restore_optimizer": req.restore_optimizer,
            "trainer": self._capability(),
            "actor": self._actor_info(),
            "actor_jwt": self._jwt(run.jwt),
        }

    def _renew(self, kind: str, cuid: str) -> dict[str, Any]:
        if kind == "training":
            run = self._runs[cuid]
            token = run.jwt
            ids = {"training_run_cuid": cuid}
        else:
            token = self._samplers[cuid][0]
            ids = {"sampling_run_cuid": cuid}
        return {
            **ids,
            "service_session_cuid": "ss",
            "workspace_cuid": "ws_fake",
            "actor": self._actor_info(),
            "actor_jwt": self._jwt(token),
        }

    def _create_sampling_run(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        from pytrio.protocol.control.sampling_run.create import SamplingRunCreateRequest

        req = SamplingRunCreateRequest.model_validate(body)
        # The weights load on the first sample (as a real sampler warms up after the control
        # plane answers), so creating a run stays fast.
        if req.source_checkpoint_uri:
            ckpt = self._checkpoint(req.source_checkpoint_uri)
            run, folder = ckpt.run, ckpt.folder
        else:
            path = self._resolve_model(req.base_model)
            run, folder = TrainingRun("base", req.base_model, path, 4, 0, False, True, False), None
        alias, path = run.base_model, run.model_path
        provider = _LazySampler(
            (lambda: self.policy) if self.policy else (lambda: self._load_sampler(run, folder))
        )
        cuid, token = _cuid("sr"), f"actor-jwt-{uuid.uuid4().hex}"
        with self._lock:
            self._samplers[cuid] = (token, provider)
            while len(self._samplers) > self.sampler_cache:  # old weights are never sampled again
                oldest = next(iter(self._samplers))
                self._samplers.pop(oldest)[1].close()
        self._bump("sampling_runs")
        return {
            "sampling_run_cuid": cuid,
            "service_session_cuid": session,
            "workspace_cuid": "ws_fake",
            "status": "READY",
            "run_index": 1,
            "model_spec_cuid": "spec_fake",
            "model_alias": alias,
            "model_id": path,
            "sampler": self._capability(),
            "actor": self._actor_info(),
            "actor_jwt": self._jwt(token),
            "created_at": _now(),
        }

    def _load_sampler(self, run: TrainingRun, folder: Path | None) -> Any:
        with self._compute_lock:
            provider = self._new_provider(run)
            if folder is not None:
                provider.load_state(str(folder))
        return provider

    def _checkpoint(self, uri: str) -> Checkpoint:
        ckpt = self._checkpoints.get(uri)
        if ckpt is None:
            raise _Reply(404, "checkpoint_not_found", f"checkpoint {uri!r} not found")
        return ckpt

    # ------------------------------------------------------------------ computation

    def _new_provider(self, run: TrainingRun) -> Any:
        """A local provider for ``run``: the run's LoRA, fp32 on the CPU, temperature 1."""
        return compute.new_provider(
            run.model_path,
            rank=run.rank,
            seed=run.seed,
            train_attn=run.train_attn,
            train_mlp=run.train_mlp,
            train_unembed=run.train_unembed,
        )

    def actor_event(self, raw: bytes, token: str) -> tuple[int, dict[str, Any]]:
        from pytrio.protocol.actor.events.event import EventEnvelope

        envelope = EventEnvelope.model_validate(msgpack.unpackb(raw, raw=False))
        run = self._runs.get(envelope.metadata.run_id)
        if run is None or token != run.jwt:
            raise _Reply(401, "unauthorized", "invalid actor token")
        with self._lock:
            if envelope.event_id in self._events:
                raise _Reply(409, "event_exists", "event already submitted")
            state = {
                "version": 1,
                "event_id": envelope.event_id,
                "type": envelope.type.value,
                "status": "accepted",
            }
            self._events[envelope.event_id] = state
        self._bump(f"submit:{envelope.type.value}")
        self._queue.put((run, envelope))
        return 202, state

    def get_event(self, event_id: str, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        with self._event_done:
            while True:
                state = self._events.get(event_id)
                if state is None:
                    raise _Reply(404, "event_not_found", f"event {event_id} not found")
                remaining = deadline - time.monotonic()
                if state["status"] in ("succeeded", "failed") or remaining <= 0:
                    return dict(state)
                self._event_done.wait(remaining)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            run, envelope = item
            with self._lock:
                self._events[envelope.event_id]["status"] = "running"
            try:
                with self._compute_lock:
                    result = self._run_event(run, envelope.type.value, envelope.payload)
                final = {"status": "succeeded", "result": result}
                self._bump(f"done:{envelope.type.value}")
            except Exception as exc:  # the event fails; the actor keeps serving
                final = {
                    "status": "failed",
                    "error": {"code": type(exc).__name__, "message": str(exc)},
                }
            with self._event_done:
                self._events[envelope.event_id].update(
                    final, usage={"input_tokens": 0, "output_tokens": 0}
                )
                self._event_done.notify_all()

    def _run_event(self, run: TrainingRun, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        from pytrio.protocol.actor.events.codec import payload_model_for_event
        from pytrio.protocol.actor.events.event import EventType

        parsed = payload_model_for_event(EventType(kind)).model_validate(payload)
        if kind == "trainer.init_run":
            provider = self._new_provider(run)
            uri = parsed.checkpoint_uri
            if uri:
                provider.load_state(str(self._checkpoint(uri).folder))
                if not parsed.load_optimizer:  # weights only: a fresh optimizer
                    import torch

                    provider.learner.optimizer = torch.optim.AdamW(provider.learner.params, lr=1e-5)
            run.provider = provider
            return {}
        if run.provider is None:
            raise RuntimeError(f"{kind} before trainer.init_run")
        if kind in ("trainer.forward", "trainer.forward_backward"):
            return self._forward(run.provider, parsed, backward=kind.endswith("backward"))
        if kind == "trainer.optimize_step":
            metrics = run.provider.optim_step(compute.adam(parsed.adam_params))
            return {"metrics": dict(metrics)}
        if kind in ("trainer.save_state", "trainer.save_weights"):
            uri = f"trio://fake/{run.cuid}/{parsed.name}"
            if uri in self._checkpoints and not parsed.overwrite:
                raise FileExistsError(f"checkpoint {parsed.name!r} already exists")
            folder = self._root / run.cuid / parsed.name
            run.provider.save_state(str(folder))
            self._checkpoints[uri] = Checkpoint(uri, folder, run)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            return {"checkpoint": {"uri": uri, "model_id": run.model_path, "size_bytes": size}}
        if kind == "trainer.end_run":
            return {}
        raise ValueError(f"unsupported event {kind}")

    def _forward(self, provider: Any, payload: Any, *, backward: bool) -> dict[str, Any]:
        from searchr1.core.types import Datum

        loss_fn = compute.loss_by_name(payload.loss.type, payload.loss.config)
        datums = [
            Datum(
                tuple(t for chunk in item.model_input.chunks for t in chunk.tokens),
                tuple(item.target_ids),
                tuple(item.logprobs or ()),
                tuple(item.advantages or ()),
            )
            for item in payload.data
        ]
        # Per-token log-probs of the current weights, returned like Tinker's loss_fn_outputs.
        logprobs, loss, tokens = compute.forward(provider, datums, loss_fn, backward=backward)
        return {
            "loss_fn_outputs": [{"logprobs": _wire(lp)} for lp in logprobs],
            "metrics": {
                "loss_sum": loss,
                "loss_mean": loss / tokens if tokens else 0.0,
                "token_count": tokens,
            },
        }

    def sample(self, sampling_run: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        from pytrio.protocol.actor.sampling_run.sample import SampleRequest

        from searchr1.core.types import SamplingParams

        with self._lock:
            entry = self._samplers.get(sampling_run)
        if entry is None:
            raise _Reply(404, "sampling_run_not_found", f"sampling run {sampling_run} not found")
        if token != entry[0]:
            raise _Reply(401, "unauthorized", "invalid actor token")
        req = SampleRequest.model_validate(body)
        p = dict(req.sampling_params)
        if p.get("top_k", -1) not in (-1, 0):
            raise _Reply(400, "invalid_request", "the fake sampler has no top_k")
        params = SamplingParams(
            max_tokens=int(p["max_tokens"]),
            temperature=float(p.get("temperature", 1.0)),
            top_p=float(p.get("top_p", 1.0)),
            stop_strings=tuple(p.get("stop") or ()),
            stop_token_ids=tuple(p.get("stop_token_ids") or ()),
            seed=p.get("seed"),
        )
        prompt = [t for chunk in req.prompt.chunks for t in chunk.tokens]
        provider = entry[1].get()
        seqs = asyncio.run(provider.sample(prompt, req.num_samples, params))
        self._bump("samples")
        tok = provider.tokenizer
        return {
            "request_id": req.request_id,
            "sampling_run": sampling_run,
            "sequences": [
                {
                    "tokens": list(s.tokens),
                    "text": tok.decode(list(s.tokens)) if req.return_text else None,
                    "logprobs": list(s.logprobs),
                    "stop_reason": s.stop_reason,
                }
                for s in seqs
            ],
            "usage": {
                "input_tokens": len(prompt) * req.num_samples,
                "output_tokens": sum(len(s.tokens) for s in seqs),
            },
        }


class _LazySampler:
    """A sampling run's provider, built on first use."""

    def __init__(self, build: Callable[[], Any]):
        self._build = build
        self._provider: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._provider is None:
                self._provider = self._build()
            return self._provider

    def close(self) -> None:
        if self._provider is not None:
            self._provider.close()


def _wire(array: np.ndarray) -> dict[str, Any]:
    data = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "<f4", "shape": list(data.shape), "encoding": "raw_le", "data": data.tobytes()}


def _handler_for(fake: FakePyTrio) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def _handle(self, method: str) -> None:
            start = time.monotonic()
            try:
                self._route(method)
            finally:
                with fake._lock:
                    fake.requests.append(
                        (method, urlsplit(self.path).path, start, time.monotonic())
                    )

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            path = parts.path
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake._bump(f"{method} {path}")
            fault = fake._take_fault(method, path)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            try:
                if fault is not None and fault.status:
                    raise _Reply(
                        fault.status,
                        fault.code or f"http_{fault.status}",
                        f"injected HTTP {fault.status}",
                    )
                if path.startswith("/api/"):
                    body = json.loads(raw) if raw else {}
                    self._json(200, fake.control(method, path, query, body, self.headers))
                elif path.startswith("/actor/"):
                    self._actor(method, path.removeprefix("/actor/"), raw)
                else:
                    raise _Reply(404, "not_found", path)
            except _Reply as reply:
                self._json(reply.status, {"code": reply.code, "message": reply.message})
            except Exception as exc:  # a bug in the fake or a request the SDK models reject
                self._json(
                    400, {"code": "invalid_request", "message": f"{type(exc).__name__}: {exc}"}
                )

        def _actor(self, method: str, route: str, raw: bytes) -> None:
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if method == "POST" and route == "v1/events":
                status, body = fake.actor_event(raw, token)
                self._msgpack(status, body)
                return
            m = re.fullmatch(r"v1/events/([^/]+)", route)
            if method == "GET" and m:
                wait = re.search(r"wait=(\d+)", self.headers.get("Prefer", ""))
                self._msgpack(
                    200, fake.get_event(m.group(1), float(wait.group(1)) if wait else 0.0)
                )
                return
            if method == "POST" and route == "v1/client/heartbeat":
                self._json(200, {"heartbeat_ms": 60000})
                return
            m = re.fullmatch(r"v1/sampling-runs/([^/]+)/sample", route)
            if method == "POST" and m:
                self._json(200, fake.sample(m.group(1), token, json.loads(raw)))
                return
            raise _Reply(404, "not_found", route)

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-request-id", f"req_{next(_request_ids)}")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

        def _json(self, status: int, body: Any) -> None:
            self._send(status, "application/json", json.dumps(body).encode())

        def _msgpack(self, status: int, body: Any) -> None:
            self._send(status, "application/msgpack", msgpack.packb(body, use_bin_type=True))

    return Handler


_request_ids = itertools.count(1)
