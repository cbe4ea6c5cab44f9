"""The sampler's own copy of the LoRA weights, for pipelined steps (``train.max_staleness > 0``).

The ``local`` provider samples and trains one peft model in one process. With pipelined
steps the next step's rollouts run while the learner (in a worker thread) runs
``forward_backward`` and ``optim_step`` on that model, and a rollout must sample one version
of the weights from its first token to its last. :class:`SamplerWeights` gives the sampler
that version.
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
