"""The sampler's own copy of the LoRA weights, for pipelined steps (``train.max_staleness > 0``).

The ``local`` provider samples and trains one peft model in one process. With pipelined
steps the next step's rollouts run while the learner (in a worker thread) runs
``forward_backward`` and ``optim_step`` on that model, and a rollout must sample one version
of the weights from its first token to its last. :class:`SamplerWeights` gives the sampler
that version:

* :meth:`SamplerWeights.publish` -- called by the provider right after each ``optim_step``
  (learner thread) -- copies the trainable (LoRA) tensors;
* :meth:`SamplerWeights.pin` -- called by the train loop at the start of every rollout,
  through the provider's ``snapshot_sampler()`` -- makes the newest published copy the one
  the sampler uses from then on;
* the sampler takes the model through :class:`SamplerWeights` instead of the plain model lock
  (it is a drop-in for it): entering swaps the pinned tensors into the LoRA parameters
  (``param.data``, pointer swaps, no copy), leaving swaps the learner's back. Both happen under
  the one model lock the learner also holds, so the learner never sees the sampler's tensors
  and the sampler never sees an update mid-rollout. A batch running when a new version is
  pinned admits no further requests (:meth:`SamplerWeights.running_pinned`), so every request
  made after :meth:`pin` samples the pinned version.

Until the first :meth:`pin` nothing is copied or swapped: a synchronous run
(``max_staleness = 0``) never pins.

Memory: the frozen base weights are shared; the cost is one copy of the adapter's trainable
tensors (two for a moment, between a ``publish`` and the next ``pin``) -- for a rank-32
all-linear adapter of a 7B model about 160 MB in bf16 each. The sampler's retained KV caches
stay alive while the learner trains (they are valid for the pinned weights), so on a
GPU the learner's activations and the sampler's caches are resident together; lower
``[model.local] max_batch_tokens`` if a pipelined run runs out of memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class SamplerWeights:
    """The lock the sampler enters to use the model, and the adapter version it samples."""

    def __init__(self, model: Any, lock: threading.Lock) -> None:
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._lock = lock
        self._published: list[torch.Tensor] | None = None
        self._pinned: list[torch.Tensor] | None = None
        self._held: list[torch.Tensor] | None = None  # the learner's tensors while swapped
        self._used: list[torch.Tensor] | None = None  # the version the sampler last ran
        #: called (under the lock) when the sampler first runs a newly pinned version: its
        #: retained caches were computed with the previous weights
        self.on_new_version: Callable[[], None] = lambda: None

    @property
    def pinned(self) -> bool:
        return self._pinned is not None

    def running_pinned(self) -> bool:
        """Whether the batch the sampler is running (under this lock) samples the pinned
        version: a request queued after a new :meth:`pin` must not join an older batch."""
        return self._pinned is None or self._pinned is self._used

    def publish(self) -> None:
        """Copy the learner's current adapter tensors as the newest version. Only once
        pinning is in use (a synchronous run copies nothing)."""
        if self._pinned is None:
            return
        with self._lock:
            self._published = self._copy()

    def pin(self) -> None:
        """Sample on the newest published version from now on (the current weights when
        nothing was published since the start or since :meth:`reset`)."""
        if self._published is None:
            with self._lock:
                self._published = self._copy()
        self._pinned = self._published

    def reset(self) -> None:
        """Forget published versions (the provider loaded other weights)."""
        self._published = None
        if self._pinned is not None:
            self._pinned = None

    def _copy(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self._params]

    # The sampler's ``with model_lock:`` -------------------------------------------------

    def __enter__(self) -> SamplerWeights:
        self._lock.acquire()
        try:
            pinned = self._pinned
            if pinned is not None:
                if pinned is not self._used:
                    self._used = pinned
                    self.on_new_version()
                self._held = [p.data for p in self._params]
                for p, t in zip(self._params, pinned, strict=True):
                    p.data = t
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._held is not None:
                for p, t in zip(self._params, self._held, strict=True):
                    p.data = t
                self._held = None
        finally:
            self._lock.release()
