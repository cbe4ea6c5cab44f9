"""What every loopback fake service of these tests shares: fault injection, a request log,
counters, and samplers built on first use.

Used by ``tests/helpers/fake_pytrio_service.py`` and ``tests/helpers/fake_tinker_service.py``. A fake's HTTP
handler asks :meth:`FaultsAndLog.take_fault` before it handles a request and appends
``(method, path, start, end)`` to :attr:`FaultsAndLog.requests` before it answers, so a test
that got the answer finds the request in the log.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method`` and the ``path`` regex with
    ``status`` (after ``delay`` seconds), or -- with ``status=0`` -- handle them normally but
    only after ``delay`` seconds. ``code``: the error code in the body, where the protocol has
    one. ``body``: answer 200 with these bytes instead (an answer that is not the API's)."""

    method: str
    path: str
    status: int = 0
    times: int = 1
    delay: float = 0.0
    code: str = ""
    body: bytes | None = None
    hits: int = 0


class FaultsAndLog:
    """Fault injection, counters and the request log of one fake service."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.faults: list[Fault] = []
        self.counts: dict[str, int] = {}
        #: every request as (method, path, start, end) in time.monotonic() seconds, for tests
        #: that check which requests were in flight together
        self.requests: list[tuple[str, str, float, float]] = []

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

    def take_fault(self, method: str, path: str) -> Fault | None:
        """The injected fault this request hits (counted), or None."""
        with self._lock:
            for fault in self.faults:
                if fault.hits < fault.times and fault.method == method:
                    if re.search(fault.path, path):
                        fault.hits += 1
                        return fault
        return None

    def log_request(self, method: str, path: str, start: float, end: float) -> None:
        with self._lock:
            self.requests.append((method, path, start, end))


class LazySampler:
    """A sampler's model provider, built on first use (as a real sampler warms up after the
    control plane answered)."""

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
