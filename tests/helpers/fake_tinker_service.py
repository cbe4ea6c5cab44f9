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

Modules: :mod:`fake_tinker_futures` (request ids, the worker, long polls),
:mod:`fake_tinker_sampling` (sampling sessions and ``asample``),
:mod:`fake_tinker_wire` (protobuf, HTTP), :mod:`fake_service_base` (faults, request log).
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

import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fake_service_compute as compute
from fake_service_base import FaultsAndLog, LazySampler
from fake_tinker_futures import Future, Futures, UnknownRequest
from fake_tinker_sampling import SamplingRoutes
from fake_tinker_wire import Reply, datum, forward_output, handler_for
from trainer_calls import load_state, optim_step

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


class FakeTinker(SamplingRoutes, FaultsAndLog):
    """The fake service. Use as a context manager; ``base_url`` is what ``api_base`` gets.

    ``retrieve_futures``: tell the SDK to wait for samples through the sampling session's
    completion queue (``retrieve_futures``) instead of one ``retrieve_future`` poll each.
    ``long_poll``: how long ``retrieve_future(s)`` holds a request open for an answer."""

    def __init__(
        self, api_key: str = API_KEY, *, retrieve_futures: bool = True, long_poll: float = 5.0
    ) -> None:
        super().__init__()
        self.api_key = api_key
        self.retrieve_futures = retrieve_futures
        #: session id -> finish status ("success", "errored", ...) once the SDK closed it
        self.finished: dict[str, str] = {}
        self.futures = Futures(self._bump, long_poll)
        self._root = Path(tempfile.mkdtemp(prefix="fake-tinker-"))
        self._sessions: set[str] = set()
        self._models: dict[str, Model] = {}
        self._checkpoints: dict[str, tuple[Path, Model]] = {}  # tinker:// path -> folder
        self._samplers: dict[str, LazySampler] = {}  # sampling session id -> its model
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def timings(self) -> list[tuple[str, float, float]]:
        """(kind, start, end) of every computation, in time.monotonic() seconds."""
        return self.futures.timings

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeTinker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.futures.close()
        for sampler in self._samplers.values():
            sampler.close()
        for model in self._models.values():
            if model.provider is not None:
                model.provider.close()
        shutil.rmtree(self._root, ignore_errors=True)

    # ------------------------------------------------------------------ routing

    def handle(self, path: str, body: Any, headers: Any) -> Any:
        """One ``POST /api/v1/...`` (or GET) request; returns the JSON answer (or bytes)."""
        route = path.removeprefix("/api/v1/")
        if route == "telemetry":
            self._bump("telemetry")
            return {"status": "accepted"}
        if headers.get("X-API-Key") != self.api_key:
            raise Reply(401, "Invalid API key")
        if route in _ROUTES:
            return getattr(self, "_" + route.replace("/", "__"))(body)
        m = re.fullmatch(r"sessions/([^/]+)/finish", route)
        if m:
            self.finished[m.group(1)] = str(body.get("reason", {}).get("type", ""))
            return None
        raise Reply(404, f"no route {path}")

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
            raise Reply(410, "session finished")
        self._bump("heartbeat")
        return {"type": "session_heartbeat"}

    # ------------------------------------------------------------------ futures

    def _answer(self, future: Future, model_id: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"request_id": future.request_id}
        if model_id:
            out["model_id"] = model_id
        return out

    def _retrieve_future(self, body: dict[str, Any]) -> Any:
        from tinker.types.future_retrieve_request import FutureRetrieveRequest

        req = FutureRetrieveRequest.model_validate(body)
        try:
            return self.futures.retrieve(req.request_id)
        except UnknownRequest:
            raise Reply(404, f"request {req.request_id} not found") from None

    def _retrieve_futures(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types.futures_retrieve_request import FuturesRetrieveRequest

        req = FuturesRetrieveRequest.model_validate(body)
        target = req.target.sampling_session_id
        return self.futures.completions(target, req.prev_cursor, req.timeout)

    def _cancel_future(self, body: dict[str, Any]) -> None:
        return None

    # ------------------------------------------------------------------ training

    def _create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import CreateModelRequest

        req = CreateModelRequest.model_validate(body)
        try:
            path = compute.resolve_model(req.base_model)
        except compute.ModelNotFound as exc:
            raise Reply(404, str(exc)) from None
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

        return self._answer(self.futures.submit("CreateModel", create), model.model_id)

    def _new_provider(self, model: Model) -> Any:
        return compute.new_provider(
            model.model_path, rank=model.rank, seed=model.seed, **model.lora
        )

    def _model(self, model_id: str) -> Model:
        model = self._models.get(model_id)
        if model is None:
            raise Reply(404, f"model {model_id} not found")
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
                return self._answer(self.futures.get(model.seq_ids[seq_id]), model.model_id)
            future = self.futures.submit(kind, work)
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
        datums = [datum(d) for d in msg.data]
        backward = not msg.forward_only

        def run() -> bytes:
            lps, loss, tokens = compute.forward(model.provider, datums, loss_fn, backward=backward)
            return forward_output(lps, {"loss:sum": loss, "token_count:sum": float(tokens)})

        kind = "ForwardBackward"  # the SDK reads both kinds as a ForwardBackwardOutput
        return self._ordered(model, msg.seq_id, kind, run)

    def _optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import OptimStepRequest

        req = OptimStepRequest.model_validate(body)
        model = self._model(req.model_id)

        def run() -> dict[str, Any]:
            metrics = optim_step(model.provider, compute.adam(req.optim_params))
            return {"metrics": {k: float(v) for k, v in metrics.items()}}

        return self._ordered(model, req.seq_id, "OptimStep", run)

    def _save_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import SaveWeightsRequest

        req = SaveWeightsRequest.model_validate(body)
        model = self._model(req.model_id)
        path = f"tinker://{model.model_id}/weights/{req.path or uuid.uuid4().hex[:8]}"
        if path in self._checkpoints and not req.overwrite:
            raise Reply(409, f"checkpoint {path} exists")

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
            raise Reply(404, f"checkpoint {req.path} not found")
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
            load_state(model.provider, str(folder))
            if not req.optimizer:  # weights only: a fresh optimizer
                import torch

                learner = model.provider.learner
                learner.optimizer = torch.optim.AdamW(learner.params, lr=1e-5)
            return {"path": req.path, "model_id": model.model_id, "type": "load_weights"}

        return self._ordered(model, req.seq_id, "LoadWeights", run)
