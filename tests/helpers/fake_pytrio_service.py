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

Modules: :mod:`fake_pytrio_control` (the control API), :mod:`fake_pytrio_wire` (HTTP,
msgpack), :mod:`fake_service_base` (faults, request log). Computation:
:mod:`fake_service_compute` (a ``LocalModelProvider`` per training run, another
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
import queue
import shutil
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fake_service_compute as compute
import msgpack
from fake_pytrio_control import Checkpoint, ControlAPI, TrainingRun
from fake_pytrio_wire import Reply, handler_for, wire
from fake_service_base import FaultsAndLog
from trainer_calls import load_state, optim_step

API_KEY = "sk-fake-taotoken-0123456789"


class FakePyTrio(ControlAPI, FaultsAndLog):
    """The fake service. Use as a context manager; ``base_url`` is what ``api_base`` gets."""

    def __init__(
        self, api_key: str = API_KEY, *, sampler_cache: int = 3, policy: Any = None
    ) -> None:
        super().__init__()
        self.api_key = api_key
        #: a model provider that answers every sample instead of the run's weights (a
        #: scripted policy, for tests that need exact trajectories through the real SDK)
        self.policy = policy
        self.sampler_cache = sampler_cache
        self._root = Path(tempfile.mkdtemp(prefix="fake-pytrio-"))
        self._compute_lock = threading.Lock()  # one model computation at a time
        self._sessions: set[str] = set()
        self._runs: dict[str, TrainingRun] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._samplers: dict[str, tuple[str, Any]] = {}  # cuid -> (jwt, provider)
        self._events: dict[str, dict[str, Any]] = {}
        self._event_done = threading.Condition(self._lock)
        self._queue: queue.Queue[tuple[TrainingRun, Any] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="fake-pytrio-actor", daemon=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
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
            raise Reply(401, "unauthorized", "invalid actor token")
        with self._lock:
            if envelope.event_id in self._events:
                raise Reply(409, "event_exists", "event already submitted")
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
                    raise Reply(404, "event_not_found", f"event {event_id} not found")
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
                load_state(provider, str(self._checkpoint(uri).folder))
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
            metrics = optim_step(run.provider, compute.adam(parsed.adam_params))
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
            "loss_fn_outputs": [{"logprobs": wire(lp)} for lp in logprobs],
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
            raise Reply(404, "sampling_run_not_found", f"sampling run {sampling_run} not found")
        if token != entry[0]:
            raise Reply(401, "unauthorized", "invalid actor token")
        req = SampleRequest.model_validate(body)
        p = dict(req.sampling_params)
        if p.get("top_k", -1) not in (-1, 0):
            raise Reply(400, "invalid_request", "the fake sampler has no top_k")
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
