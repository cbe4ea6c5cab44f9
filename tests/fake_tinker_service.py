"""A loopback fake of the Tinker service, computed by the ``local`` model provider.

The real ``tinker`` SDK (0.38) talks real HTTP to it on 127.0.0.1. It speaks the part of the
protocol the SDK uses for LoRA RL training (as read from ``tinker`` 0.38's client code):

* session setup: ``client/config`` (server feature flags: API-key auth, no JWT exchange),
  ``client/dynamic_config``, ``create_session``, ``session_heartbeat``,
  ``sessions/{id}/finish`` and the ``telemetry`` sink, all JSON under ``/api/v1``;
* training calls that each return a request id at once (an "untyped future"):
  ``create_model``, ``forward_backward`` (a protobuf body, ``tinker.proto``), ``optim_step``,
  ``save_weights``, ``save_weights_for_sampler``, ``load_weights``; and ``get_info``;
* sampling: ``create_sampling_session``, ``asample`` (also a request id);
* results: ``retrieve_future`` long-polls one request id and answers JSON, protobuf (for
  ``ForwardBackwardOutput`` and ``SampleResponse``), ``{"type": "try_again"}`` when the
  request is still running, or ``{"error": ...}``; ``retrieve_futures`` long-polls a sampling
  session's completion queue (the SDK uses it when ``sample_use_retrieve_futures`` is on).

Requests are parsed with the SDK's own strict pydantic models and protobuf messages, so a drift
between what the SDK sends and what it declares fails loudly here; responses are validated by
the SDK on its side. Training requests of one model run in submission order on one worker
thread; a request resubmitted with a ``seq_id`` already seen (an SDK retry after a lost
answer) gets the first request's id, so it is computed once.

Computation: :mod:`fake_service_compute` (a ``LocalModelProvider`` per training run, another
per sampler snapshot).

Faults: :meth:`FakeTinker.inject` makes matching requests fail with a status or answer late,
a given number of times. :attr:`FakeTinker.requests` records when each request started and
ended, so a test can tell which requests the SDK had in flight together.

Not faithful (unknown here): how the real trainer normalises a loss (the fake sums), queueing
and capacity (``try_again`` carries no queue state), metadata-only answers for large payloads,
custom losses, JWT auth, ``compute_logprobs``, prompt log-probs, image inputs.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fake_service_compute as compute
import numpy as np

API_KEY = "tml-fake-tinker-0123456789"
#: the JSON routes under /api/v1 (``forward_backward`` is protobuf, handled on its own)
_ROUTES = (
    "client/config",
    "client/dynamic_config",
    "create_session",
    "session_heartbeat",
    "retrieve_future",
    "retrieve_futures",
    "cancel_future",
    "create_model",
    "get_info",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "load_weights",
    "create_sampling_session",
    "asample",
)
#: result kinds the SDK asks for as protobuf (``Accept: application/x-protobuf``)
_PROTO_KINDS = ("ForwardBackward", "Sample")


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
    hits: int = 0


@dataclass
class Future:
    """One request id: what it computes and, once done, its answer."""

    request_id: str
    kind: str  # CreateModel, ForwardBackward, OptimStep, SaveWeights, Sample, ...
    done: bool = False
    result: Any = None  # a JSON-able dict, or protobuf bytes for _PROTO_KINDS
    error: str = ""
    session: str = ""  # the sampling session of a Sample, for retrieve_futures


@dataclass
class Model:
    model_id: str
    base_model: str
    model_path: str
    rank: int
    seed: int | None
    lora: dict[str, bool]
    provider: Any = None
    seq_ids: dict[int, str] = field(default_factory=dict)  # seq_id -> request id


class _Reply(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class FakeTinker:
    """The fake service. Use as a context manager; ``base_url`` is what ``api_base`` gets.

    ``retrieve_futures``: tell the SDK to wait for samples through the sampling session's
    completion queue (``retrieve_futures``) instead of one ``retrieve_future`` poll each.
    ``long_poll``: how long ``retrieve_future(s)`` holds a request open for an answer."""

    def __init__(
        self, api_key: str = API_KEY, *, retrieve_futures: bool = True, long_poll: float = 5.0
    ) -> None:
        self.api_key = api_key
        self.retrieve_futures = retrieve_futures
        self.long_poll = long_poll
        self.faults: list[Fault] = []
        self.counts: dict[str, int] = {}
        #: every request as (method, path, start, end) in time.monotonic() seconds
        self.requests: list[tuple[str, str, float, float]] = []
        #: session id -> finish status ("success", "errored", ...) once the SDK closed it
        self.finished: dict[str, str] = {}
        #: (kind, start, end) of every computation, in time.monotonic() seconds
        self.timings: list[tuple[str, float, float]] = []
        self._root = Path(tempfile.mkdtemp(prefix="fake-tinker-"))
        self._lock = threading.RLock()
        self._done = threading.Condition(self._lock)
        self._compute_lock = threading.Lock()  # one model computation at a time
        self._ids = itertools.count(1)
        self._sessions: set[str] = set()
        self._models: dict[str, Model] = {}
        self._checkpoints: dict[str, tuple[Path, Model]] = {}  # tinker:// path -> folder
        self._samplers: dict[str, _LazySampler] = {}  # sampling session id -> its model
        self._futures: dict[str, Future] = {}
        self._completions: dict[str, list[tuple[int, str, bool]]] = {}  # session -> log
        self._train_queue: list[tuple[Future, Callable[[], Any]]] = []
        self._train_ready = threading.Condition(self._lock)
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="fake-tinker-train", daemon=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeTinker:
        self._worker.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._closed = True
            self._train_ready.notify_all()
        for sampler in self._samplers.values():
            sampler.close()
        for model in self._models.values():
            if model.provider is not None:
                model.provider.close()
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

    # ------------------------------------------------------------------ routing

    def handle(self, path: str, body: Any, headers: Any) -> Any:
        """One ``POST /api/v1/...`` (or GET) request; returns the JSON answer (or bytes)."""
        route = path.removeprefix("/api/v1/")
        if route == "telemetry":
            self._bump("telemetry")
            return {"status": "accepted"}
        if headers.get("X-API-Key") != self.api_key:
            raise _Reply(401, "Invalid API key")
        if route in _ROUTES:
            return getattr(self, "_" + route.replace("/", "__"))(body)
        m = re.fullmatch(r"sessions/([^/]+)/finish", route)
        if m:
            self.finished[m.group(1)] = str(body.get("reason", {}).get("type", ""))
            return None
        raise _Reply(404, f"no route {path}")

    # ------------------------------------------------------------------ session

    def _client__config(self, body: dict[str, Any]) -> dict[str, Any]:  # client/config
        return {
            "pjwt_auth_enabled": False,
            "sample_use_retrieve_futures": self.retrieve_futures,
            "proto_compress_fwdbwd": False,
        }

    def _client__dynamic_config(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"refresh_interval_sec": 300}

    def _create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import CreateSessionRequest

        CreateSessionRequest.model_validate(body)
        session = f"session-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._sessions.add(session)
        return {"type": "create_session", "session_id": session}

    def _session_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("session_id") in self.finished:
            raise _Reply(410, "session finished")
        self._bump("heartbeat")
        return {"type": "session_heartbeat"}

    # ------------------------------------------------------------------ futures

    def _submit(self, kind: str, work: Callable[[], Any], *, session: str = "") -> Future:
        future = Future(f"req-{next(self._ids)}", kind, session=session)
        with self._lock:
            self._futures[future.request_id] = future
        self._bump(f"submit:{kind}")
        if kind == "Sample":
            threading.Thread(target=self._run, args=(future, work), daemon=True).start()
        else:
            with self._lock:
                self._train_queue.append((future, work))
                self._train_ready.notify()
        return future

    def _answer(self, future: Future, model_id: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"request_id": future.request_id}
        if model_id:
            out["model_id"] = model_id
        return out

    def _work(self) -> None:
        """Training requests, one at a time in submission order (like one trainer)."""
        while True:
            with self._lock:
                while not self._train_queue and not self._closed:
                    self._train_ready.wait()
                if self._closed:
                    return
                future, work = self._train_queue.pop(0)
            self._run(future, work)

    def _run(self, future: Future, work: Callable[[], Any]) -> None:
        try:
            with self._compute_lock:
                started = time.monotonic()
                result, error = work(), ""
                self.timings.append((future.kind, started, time.monotonic()))
            self._bump(f"done:{future.kind}")
        except Exception as exc:  # the request fails; the service keeps serving
            result, error = None, f"{type(exc).__name__}: {exc}"
        with self._done:
            future.result, future.error, future.done = result, error, True
            if future.session:
                log = self._completions.setdefault(future.session, [])
                log.append((len(log) + 1, future.request_id, not error))
            self._done.notify_all()

    def _retrieve_future(self, body: dict[str, Any]) -> Any:
        from tinker.types.future_retrieve_request import FutureRetrieveRequest

        req = FutureRetrieveRequest.model_validate(body)
        deadline = time.monotonic() + self.long_poll
        with self._done:
            future = self._futures.get(req.request_id)
            if future is None:
                raise _Reply(404, f"request {req.request_id} not found")
            while not future.done and (left := deadline - time.monotonic()) > 0:
                self._done.wait(left)
        if not future.done:
            return {"type": "try_again", "request_id": future.request_id}
        if future.error:
            return {"error": future.error, "category": "user"}
        return future.result

    def _retrieve_futures(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types.futures_retrieve_request import FuturesRetrieveRequest

        req = FuturesRetrieveRequest.model_validate(body)
        session = req.target.sampling_session_id
        wait = self.long_poll if req.timeout is None else min(req.timeout, self.long_poll)
        deadline = time.monotonic() + wait
        with self._done:
            while True:
                log = self._completions.get(session, [])
                new = [c for c in log if c[0] > req.prev_cursor]
                left = deadline - time.monotonic()
                if new or left <= 0:
                    break
                self._done.wait(left)
        completions = [
            {"state": "finished", "request_id": rid}
            if ok
            else {"state": "failed", "request_id": rid}
            for _, rid, ok in new
        ]
        cursor = new[-1][0] if new else req.prev_cursor
        return {"completions": completions, "cursor": cursor}

    def _cancel_future(self, body: dict[str, Any]) -> None:
        return None

    # ------------------------------------------------------------------ training

    def _create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import CreateModelRequest

        req = CreateModelRequest.model_validate(body)
        try:
            path = compute.resolve_model(req.base_model)
        except compute.ModelNotFound as exc:
            raise _Reply(404, str(exc)) from None
        lora = req.lora_config
        assert lora is not None, "the fake trains LoRA adapters only"
        model = Model(
            model_id=f"{req.session_id}:train:{req.model_seq_id}",
            base_model=req.base_model,
            model_path=path,
            rank=lora.rank,
            seed=lora.seed,
            lora={
                "train_attn": lora.train_attn,
                "train_mlp": lora.train_mlp,
                "train_unembed": lora.train_unembed,
            },
        )
        with self._lock:
            self._models[model.model_id] = model

        def create() -> dict[str, Any]:
            model.provider = self._new_provider(model)
            return {"model_id": model.model_id, "type": "create_model"}

        return self._answer(self._submit("CreateModel", create), model.model_id)

    def _new_provider(self, model: Model) -> Any:
        return compute.new_provider(
            model.model_path, rank=model.rank, seed=model.seed, **model.lora
        )

    def _model(self, model_id: str) -> Model:
        model = self._models.get(model_id)
        if model is None:
            raise _Reply(404, f"model {model_id} not found")
        return model

    def _get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import GetInfoRequest

        model = self._model(GetInfoRequest.model_validate(body).model_id)
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {"arch": "llama", "model_name": model.base_model},
            "is_lora": True,
            "lora_rank": model.rank,
        }

    def _ordered(self, model: Model, seq_id: int | None, kind: str, work: Callable[[], Any]) -> Any:
        """Submit ``work`` once per (model, seq_id): a retried request gets the first id."""
        with self._lock:
            if seq_id is not None and seq_id in model.seq_ids:
                self._bump(f"duplicate:{kind}")
                return self._answer(self._futures[model.seq_ids[seq_id]], model.model_id)
            future = self._submit(kind, work)
            if seq_id is not None:
                model.seq_ids[seq_id] = future.request_id
        return self._answer(future, model.model_id)

    def forward_backward(self, raw: bytes, content_encoding: str) -> dict[str, Any]:
        """``POST /api/v1/forward_backward``: the body is a ``ForwardBackwardRequest`` proto."""
        from tinker.proto import tinker_public_pb2 as pb

        if content_encoding == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(raw)
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(raw)
        model = self._model(msg.model_id)
        config = {k: v.number for k, v in msg.loss_fn_config_v2.items()} or dict(msg.loss_fn_config)
        loss_fn = compute.loss_by_name(msg.loss_fn, config)
        datums = [_datum(d) for d in msg.data]
        backward = not msg.forward_only

        def run() -> bytes:
            lps, loss, tokens = compute.forward(model.provider, datums, loss_fn, backward=backward)
            return _forward_output(lps, {"loss:sum": loss, "token_count:sum": float(tokens)})

        kind = "ForwardBackward"  # the SDK reads both kinds as a ForwardBackwardOutput
        return self._ordered(model, msg.seq_id, kind, run)

    def _optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import OptimStepRequest

        req = OptimStepRequest.model_validate(body)
        model = self._model(req.model_id)

        def run() -> dict[str, Any]:
            metrics = model.provider.optim_step(compute.adam(req.optim_params))
            return {"metrics": {k: float(v) for k, v in metrics.items()}}

        return self._ordered(model, req.seq_id, "OptimStep", run)

    def _save_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import SaveWeightsRequest

        req = SaveWeightsRequest.model_validate(body)
        model = self._model(req.model_id)
        path = f"tinker://{model.model_id}/weights/{req.path or uuid.uuid4().hex[:8]}"
        if path in self._checkpoints and not req.overwrite:
            raise _Reply(409, f"checkpoint {path} exists")

        def run() -> dict[str, Any]:
            self._save(model, path)
            return {"path": path, "type": "save_weights"}

        return self._ordered(model, req.seq_id, "SaveWeights", run)

    def _save(self, model: Model, path: str) -> Path:
        folder = self._root / uuid.uuid4().hex
        model.provider.save_state(str(folder))
        with self._lock:
            self._checkpoints[path] = (folder, model)
        return folder

    def _save_weights_for_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import SaveWeightsForSamplerRequest

        req = SaveWeightsForSamplerRequest.model_validate(body)
        model = self._model(req.model_id)

        def run() -> dict[str, Any]:
            name = req.path or f"ephemeral-{uuid.uuid4().hex[:8]}"
            path = f"tinker://{model.model_id}/sampler_weights/{name}"
            folder = self._save(model, path)
            if req.sampling_session_seq_id is None:
                return {"path": path, "type": "save_weights_for_sampler"}
            session = self._new_sampler(model, folder)
            return {"sampling_session_id": session, "type": "save_weights_for_sampler"}

        return self._ordered(model, req.seq_id, "SaveWeightsForSampler", run)

    def _load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import LoadWeightsRequest

        req = LoadWeightsRequest.model_validate(body)
        if req.path not in self._checkpoints:
            raise _Reply(404, f"checkpoint {req.path} not found")
        folder, source = self._checkpoints[req.path]
        if req.model_id is not None:  # into an existing model
            model = self._model(req.model_id)
        else:  # a new training run from the checkpoint (seq id 0)
            model = Model(
                model_id=f"{req.session_id}:train:{req.model_seq_id}",
                base_model=source.base_model,
                model_path=source.model_path,
                rank=source.rank,
                seed=source.seed,
                lora=dict(source.lora),
            )
            with self._lock:
                self._models[model.model_id] = model

        def run() -> dict[str, Any]:
            if model.provider is None:
                model.provider = self._new_provider(model)
            model.provider.load_state(str(folder))
            if not req.optimizer:  # weights only: a fresh optimizer
                import torch

                learner = model.provider.learner
                learner.optimizer = torch.optim.AdamW(learner.params, lr=1e-5)
            return {"path": req.path, "model_id": model.model_id, "type": "load_weights"}

        return self._ordered(model, req.seq_id, "LoadWeights", run)

    # ------------------------------------------------------------------ sampling

    def _new_sampler(self, model: Model | None, folder: Path | None, base: str = "") -> str:
        def build() -> Any:
            if model is None:
                path = compute.resolve_model(base)
                return compute.new_provider(path, rank=4, seed=0, train_mlp=False)
            provider = self._new_provider(model)
            if folder is not None:
                provider.load_state(str(folder))
            return provider

        session = f"sampler-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._samplers[session] = _LazySampler(build)
        self._bump("sampling_sessions")
        return session

    def _create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import CreateSamplingSessionRequest

        req = CreateSamplingSessionRequest.model_validate(body)
        if req.model_path:
            if req.model_path not in self._checkpoints:
                raise _Reply(404, f"weights {req.model_path} not found")
            folder, model = self._checkpoints[req.model_path]
            session = self._new_sampler(model, folder)
        else:
            try:
                compute.resolve_model(req.base_model or "")
            except compute.ModelNotFound as exc:
                raise _Reply(404, str(exc)) from None
            session = self._new_sampler(None, None, req.base_model or "")
        return {"type": "create_sampling_session", "sampling_session_id": session}

    def _asample(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import SampleRequest

        req = SampleRequest.model_validate(body)
        sampler = self._samplers.get(req.sampling_session_id or "")
        if sampler is None:
            raise _Reply(404, f"sampling session {req.sampling_session_id} not found")
        p = req.sampling_params
        if p.top_k not in (-1, 0):
            raise _Reply(400, "the fake sampler has no top_k")
        prompt = [t for chunk in req.prompt.chunks for t in chunk.tokens]

        def run() -> bytes:
            import asyncio

            from searchr1.core.types import SamplingParams

            stop = p.stop if isinstance(p.stop, list | tuple) else ([p.stop] if p.stop else [])
            params = SamplingParams(
                max_tokens=int(p.max_tokens or 16),
                temperature=float(p.temperature),
                top_p=float(p.top_p),
                stop_strings=tuple(s for s in stop if isinstance(s, str)),
                stop_token_ids=tuple(s for s in stop if isinstance(s, int)),
                seed=p.seed,
            )
            provider = sampler.get()
            seqs = asyncio.run(provider.sample(prompt, req.num_samples, params))
            return _sample_response(seqs)

        future = self._submit("Sample", run, session=req.sampling_session_id or "")
        ids = [f"{future.request_id}-{i}" for i in range(req.num_samples)]
        return {**self._answer(future), "sample_sequence_ids": ids}


class _LazySampler:
    """A sampling session's provider, built on first use (as a sampler warms up)."""

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


# ---------------------------------------------------------------------- protobuf


def _datum(msg: Any) -> Any:
    """A ``tinker.proto`` Datum as searchr1's (dense tensors, encoded-text chunks only)."""
    from searchr1.core.types import Datum

    tokens: list[int] = []
    for chunk in msg.model_input:
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    inputs = {name: _tensor(t) for name, t in msg.loss_fn_inputs.items()}
    return Datum(
        tuple(tokens),
        tuple(int(t) for t in inputs["target_tokens"]),
        tuple(float(x) for x in inputs["logprobs"]),
        tuple(float(x) for x in inputs["advantages"]),
    )


def _tensor(msg: Any) -> np.ndarray:
    from tinker.proto import tinker_public_pb2 as pb

    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}[msg.dtype]
    if msg.HasField("sparse_csr"):
        raise ValueError("the fake takes dense tensors only")
    return np.frombuffer(msg.dense, dtype=dtype)


def _forward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` proto: one ArrayRecord with per-datum ``logprobs``."""
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = out.loss_fn_outputs.add()
    record.num_datums = len(logprobs)
    field_ = record.fields["logprobs"]
    field_.dtype = pb.DTYPE_FLOAT32
    sizes = [0] + [lp.nbytes for lp in logprobs]
    field_.offsets = np.cumsum(sizes, dtype=np.int64).tobytes()
    field_.data = b"".join(np.ascontiguousarray(lp, dtype="<f4").tobytes() for lp in logprobs)
    return out.SerializeToString()


def _sample_response(seqs: list[Any]) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.SampleResponse()
    for s in seqs:
        seq = out.sequences.add()
        seq.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
        seq.stop_reason = (
            pb.STOP_REASON_LENGTH if s.stop_reason == "length" else pb.STOP_REASON_STOP
        )
    return out.SerializeToString()


# ---------------------------------------------------------------------- HTTP


def _handler_for(fake: FakeTinker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            self._start = time.monotonic()
            self._method, self._path = method, urlsplit(self.path).path
            self._route(method, self._path)

        def _route(self, method: str, path: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake._bump(f"{method} {path}")
            fault = fake._take_fault(method, path)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            try:
                if fault is not None and fault.status:
                    raise _Reply(fault.status, f"injected HTTP {fault.status}")
                if not path.startswith("/api/v1/"):
                    raise _Reply(404, path)
                if path == "/api/v1/forward_backward":
                    if self.headers.get("X-API-Key") != fake.api_key:
                        raise _Reply(401, "Invalid API key")
                    encoding = self.headers.get("Content-Encoding", "")
                    answer = fake.forward_backward(raw, encoding)
                else:
                    body = json.loads(raw) if raw else {}
                    answer = fake.handle(path, body, self.headers)
                if isinstance(answer, bytes):
                    self._send(200, "application/x-protobuf", answer)
                else:
                    self._send(200, "application/json", json.dumps(answer).encode())
            except _Reply as reply:
                error = {"error": reply.message, "message": reply.message}
                self._send(reply.status, "application/json", json.dumps(error).encode())
            except Exception as exc:  # a bug in the fake, or a request the SDK models reject
                error = {"error": f"{type(exc).__name__}: {exc}"}
                self._send(400, "application/json", json.dumps(error).encode())

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            # Logged before the answer leaves, so a client that got it finds it in the log.
            with fake._lock:
                fake.requests.append((self._method, self._path, self._start, time.monotonic()))
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

    return Handler
