"""Results of ``forward_backward`` calls that are still in flight.

Created by the remote provider's ``forward_backward`` (the service's answer) and by the local
learner's under FSDP (the micro-batches run in ``optim_step``, in step with the other ranks);
awaited by the first read of ``loss``/``metrics``, or by the provider's ``optim_step``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from searchr1.core.types import ForwardBackwardResult


class PendingResult(ForwardBackwardResult):
    """A :class:`ForwardBackwardResult` whose ``loss`` and ``metrics`` are the service's answer
    to a ``forward_backward`` already submitted, awaited on first read.

    Why: the train loop calls ``forward_backward`` once per micro-batch, then ``optim_step``.
    Awaiting each call before the next is submitted costs one service round trip per call;
    returning this instead lets the loop submit every micro-batch and the optimizer step back
    to back, and :meth:`RemoteModelProvider.optim_step` awaits them all at once. A caller that
    reads ``loss`` or ``metrics`` before ``optim_step`` still gets the value (it just waits for
    it there), so the Trainer contract is unchanged; only a failure of the call surfaces
    at that first read (or in ``optim_step``) instead of in ``forward_backward`` itself.
    """

    def __init__(self, wait: Callable[[], ForwardBackwardResult]):  # no dataclass __init__
        object.__setattr__(self, "_wait", wait)
        object.__setattr__(self, "_value", None)
        object.__setattr__(self, "_lock", threading.Lock())

    def resolve(self) -> ForwardBackwardResult:
        """The awaited result (waits once; a failure is raised again on every read)."""
        with self._lock:
            if self._value is None:
                try:
                    value = self._wait()
                except BaseException as exc:
                    object.__setattr__(self, "_value", exc)
                    raise
                object.__setattr__(self, "_value", value)
        if isinstance(self._value, BaseException):
            raise self._value
        return self._value

    @property  # type: ignore[override]
    def loss(self) -> float:
        return self.resolve().loss

    @property  # type: ignore[override]
    def metrics(self) -> Mapping[str, float]:
        return self.resolve().metrics

    def __repr__(self) -> str:
        state = "pending" if self._value is None else repr(self._value)
        return f"PendingResult({state})"
