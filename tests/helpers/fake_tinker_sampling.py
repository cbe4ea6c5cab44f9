"""The sampling routes of the fake Tinker service (``tests/helpers/fake_tinker_service.py``).

A sampling session is a snapshot of weights: the base model (``create_sampling_session`` with
``base_model``), a saved checkpoint (with ``model_path``), or a training run's current
weights (``save_weights_for_sampler`` with a ``sampling_session_seq_id``, which is what
``save_weights_and_get_sampling_client`` sends). Its model provider is built on the first
``asample``. Each ``asample`` is a request id whose answer is a ``SampleResponse`` proto.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fake_service_compute as compute
from fake_service_base import LazySampler
from fake_tinker_wire import Reply, sample_response
from trainer_calls import load_state


class SamplingRoutes:
    """Mixed into ``FakeTinker``, which provides the attributes used here."""

    _lock: Any
    _samplers: dict[str, LazySampler]
    _checkpoints: dict[str, tuple[Path, Any]]
    futures: Any
    _new_provider: Callable[[Any], Any]
    _bump: Callable[[str], None]
    _answer: Callable[..., dict[str, Any]]

    def _new_sampler(self, model: Any, folder: Path | None, base: str = "") -> str:
        def build() -> Any:
            if model is None:
                path = compute.resolve_model(base)
                return compute.new_provider(path, rank=4, seed=0, train_mlp=False)
            provider = self._new_provider(model)
            if folder is not None:
                load_state(provider, str(folder))
            return provider

        session = f"sampler-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._samplers[session] = LazySampler(build)
        self._bump("sampling_sessions")
        return session

    def _create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import CreateSamplingSessionRequest

        req = CreateSamplingSessionRequest.model_validate(body)
        if req.model_path:
            if req.model_path not in self._checkpoints:
                raise Reply(404, f"weights {req.model_path} not found")
            folder, model = self._checkpoints[req.model_path]
            session = self._new_sampler(model, folder)
        else:
            try:
                compute.resolve_model(req.base_model or "")
            except compute.ModelNotFound as exc:
                raise Reply(404, str(exc)) from None
            session = self._new_sampler(None, None, req.base_model or "")
        return {"type": "create_sampling_session", "sampling_session_id": session}

    def _asample(self, body: dict[str, Any]) -> dict[str, Any]:
        from tinker.types import SampleRequest

        req = SampleRequest.model_validate(body)
        sampler = self._samplers.get(req.sampling_session_id or "")
        if sampler is None:
            raise Reply(404, f"sampling session {req.sampling_session_id} not found")
        p = req.sampling_params
        if p.top_k not in (-1, 0):
            raise Reply(400, "the fake sampler has no top_k")
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
            return sample_response(seqs)

        future = self.futures.submit("Sample", run, session=req.sampling_session_id or "")
        ids = [f"{future.request_id}-{i}" for i in range(req.num_samples)]
        return {**self._answer(future), "sample_sequence_ids": ids}
