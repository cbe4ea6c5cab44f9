"""The JSON control API of the fake PyTRIO service (``tests/helpers/fake_pytrio_service.py``): API-key
check, SDK bootstrap, service sessions, training runs (create, find by checkpoint URI, rebind
for ``load_state``, renew) and sampling runs (create, renew).

Mixed into ``FakePyTrio``, which holds the runs, checkpoints and samplers and computes them.
Requests are parsed with the SDK's own (strict, extra-fields-forbidden) protocol models.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fake_service_compute as compute
from fake_pytrio_wire import Reply
from fake_service_base import LazySampler
from trainer_calls import load_state


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


class ControlAPI:
    """The ``/api`` routes; ``FakePyTrio`` provides the attributes declared here."""

    api_key: str
    policy: Any
    sampler_cache: int
    base_url: str
    _lock: Any
    _compute_lock: Any
    _sessions: set[str]
    _runs: dict[str, TrainingRun]
    _checkpoints: dict[str, Checkpoint]
    _samplers: dict[str, tuple[str, Any]]
    _bump: Callable[[str], None]
    _new_provider: Callable[[TrainingRun], Any]

    def control(
        self, method: str, path: str, query: dict[str, str], body: Any, headers: Any
    ) -> Any:
        if path == "/api/telemetry/event":
            return {}
        key = headers.get("X-API-Key") or headers.get("Authorization", "").removeprefix("Bearer ")
        if key != self.api_key:
            raise Reply(401, "unauthorized", "Invalid API key")
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
        raise Reply(404, "not_found", f"no route {method} {path}")

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
            raise Reply(status, code, str(exc)) from None

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
            raise Reply(404, "not_found", f"training run {run_cuid} not found")
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
        provider = LazySampler(
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
                load_state(provider, str(folder))
        return provider

    def _checkpoint(self, uri: str) -> Checkpoint:
        ckpt = self._checkpoints.get(uri)
        if ckpt is None:
            raise Reply(404, "checkpoint_not_found", f"checkpoint {uri!r} not found")
        return ckpt
