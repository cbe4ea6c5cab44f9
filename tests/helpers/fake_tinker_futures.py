"""The request ids of the fake Tinker service: what each computes, and the long polls that
wait for them.

Every training call and every sample of ``tests/helpers/fake_tinker_service.py`` returns a request id
at once (:meth:`Futures.submit`); training requests run one at a time in submission order on
one worker thread (like one trainer), samples on threads of their own. The SDK then asks for
the answer with ``retrieve_future`` (:meth:`Futures.retrieve`: the answer, ``try_again`` after
the long poll, or an error) or, for samples, with ``retrieve_futures`` (:meth:`Futures.
completions`: a sampling session's completion queue with a cursor).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class UnknownRequest(LookupError):
    """No request has this id."""


@dataclass
class Future:
    """One request id: what it computes and, once done, its answer."""

    request_id: str
    kind: str  # CreateModel, ForwardBackward, OptimStep, SaveWeights, Sample, ...
    done: bool = False
    result: Any = None  # a JSON-able dict, or protobuf bytes
    error: str = ""
    session: str = ""  # the sampling session of a Sample, for retrieve_futures


class Futures:
    """The request ids of one fake service. ``bump(name)`` counts ``submit:<kind>`` and
    ``done:<kind>``; ``long_poll``: how long a retrieve holds a request open."""

    def __init__(self, bump: Callable[[str], None], long_poll: float) -> None:
        self._bump = bump
        self.long_poll = long_poll
        #: (kind, start, end) of every computation, in time.monotonic() seconds
        self.timings: list[tuple[str, float, float]] = []
        self._lock = threading.RLock()
        self._done = threading.Condition(self._lock)
        self._compute_lock = threading.Lock()  # one model computation at a time
        self._ids = itertools.count(1)
        self._futures: dict[str, Future] = {}
        self._completions: dict[str, list[tuple[int, str, bool]]] = {}  # session -> log
        self._train_queue: list[tuple[Future, Callable[[], Any]]] = []
        self._train_ready = threading.Condition(self._lock)
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="fake-tinker-train", daemon=True)
        self._worker.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._train_ready.notify_all()

    def get(self, request_id: str) -> Future:
        with self._lock:
            return self._futures[request_id]

    def submit(self, kind: str, work: Callable[[], Any], *, session: str = "") -> Future:
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

    def retrieve(self, request_id: str) -> Any:
        """``retrieve_future``: the answer, ``try_again`` after the long poll, or the error."""
        deadline = time.monotonic() + self.long_poll
        with self._done:
            future = self._futures.get(request_id)
            if future is None:
                raise UnknownRequest(request_id)
            while not future.done and (left := deadline - time.monotonic()) > 0:
                self._done.wait(left)
        if not future.done:
            return {"type": "try_again", "request_id": future.request_id}
        if future.error:
            return {"error": future.error, "category": "user"}
        return future.result

    def completions(self, session: str, prev_cursor: int, timeout: float | None) -> dict:
        """``retrieve_futures``: the samples of ``session`` done after ``prev_cursor``,
        waiting up to the long poll (or ``timeout``) for the first."""
        wait = self.long_poll if timeout is None else min(timeout, self.long_poll)
        deadline = time.monotonic() + wait
        with self._done:
            while True:
                log = self._completions.get(session, [])
                new = [c for c in log if c[0] > prev_cursor]
                left = deadline - time.monotonic()
                if new or left <= 0:
                    break
                self._done.wait(left)
        done = [{"state": "finished" if ok else "failed", "request_id": rid} for _, rid, ok in new]
        return {"completions": done, "cursor": new[-1][0] if new else prev_cursor}
