"""The steps in order: :func:`run_steps` collects, learns and finishes each, the rollouts of
up to ``max_staleness`` later steps prefetched while a step learns (docs/training.md,
"Pipelined steps"; docs/architecture.md, "The loop").
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from searchr1.core.distributed import World
from searchr1.rl.step import Batch, Learned


@dataclass(frozen=True)
class Window:
    """A step's window (``time.perf_counter`` seconds), from the end of the step before to
    the end of its learning; ``rollout_busy``: seconds of rollouts in it, ``overlap``: of
    those, the seconds during learning."""

    start: float
    learn_start: float
    learn_end: float
    rollout_busy: float
    overlap: float


Collect = Callable[[int, int], Awaitable[Batch]]  # (step, policy version)
Learn = Callable[[Batch], Awaitable[Learned]]
Finish = Callable[[Batch, Learned, Window], Awaitable[None]]


async def run_steps(
    first: int,
    last: int,
    *,
    max_staleness: int,
    collect: Collect,
    learn: Learn,
    finish: Finish,
    holds: Callable[[int], bool],
    stopping: Callable[[], bool],
    snapshot: Callable[[], Awaitable[None]] | None,
    world: World,
) -> None:
    """Collect, learn and finish steps ``first..last`` in order (docs/training.md, "Pipelined
    steps"). Step ``s`` learns on policy version ``s - 1``; its rollout starts once version
    ``s - 1 - max_staleness`` exists, after step ``s - 1``'s rollout, and after step ``s - 1``
    finished when ``holds(s - 1)``. With ``max_staleness > 0`` each rollout, and what samples
    after the loop, starts with ``snapshot()``. The ranks agree on ``stopping()`` after each
    step; on a stop the rollout in flight is discarded. An error in ``collect`` is raised once
    the steps before it are learned; one in ``learn`` or ``finish`` cancels the rollouts."""
    rollouts = _Rollouts(collect, snapshot if max_staleness > 0 else None, stopping, first - 1)
    ahead, window = first, time.perf_counter()  # ahead: the next step whose rollout starts
    try:
        for step in range(first, last + 1):
            while ahead <= min(last, step + max_staleness) and (
                ahead == step or not holds(ahead - 1)
            ):
                rollouts.start(ahead)
                ahead += 1
            batch = await rollouts.next()
            t0 = time.perf_counter()
            learned = await learn(batch)
            t1 = time.perf_counter()
            span = Window(window, t0, t1, rollouts.busy(window, t1), rollouts.busy(t0, t1))
            await finish(batch, learned, span)  # the periodic held-out eval runs in this loop
            rollouts.version = step
            if world.any(stopping()):
                break
            window = time.perf_counter()
    except BaseException:
        await rollouts.close(cancel=True)
        raise
    await rollouts.close(cancel=False)
    if rollouts.snapshot is not None:
        await rollouts.snapshot()  # what samples next (the eval "after") sees the trained weights


class _Rollouts:
    """The rollouts :func:`run_steps` started and has not learned yet, in step order (one at
    a time: the question stream is read in step order), and when rollouts ran."""

    def __init__(
        self,
        collect: Collect,
        snapshot: Callable[[], Awaitable[None]] | None,
        stopping: Callable[[], bool],
        version: int,
    ) -> None:
        self.collect, self.snapshot, self.stopping = collect, snapshot, stopping
        #: the policy version a rollout starting now samples
        self.version = version
        self.queued: deque[asyncio.Task[Batch | None]] = deque()
        self.spans: list[tuple[float, float]] = []
        self.running_since: float | None = None
        self.closed = False

    def start(self, step: int) -> None:
        after = self.queued[-1] if self.queued else None
        self.queued.append(asyncio.create_task(self._rollout(step, after), name=f"rollout-{step}"))

    async def _rollout(self, step: int, after: asyncio.Task[Batch | None] | None) -> Batch | None:
        """Step ``step``'s batch, or None when it never starts: a rollout before it failed,
        or the loop is ending (it never reads this one)."""
        if after is not None:
            await asyncio.wait([after])  # a wait that, cancelled, leaves ``after`` running
            if self.closed or self.stopping() or after.cancelled() or after.exception():
                return None
            if after.result() is None:  # it never started (one before it failed): nor this
                return None
        if self.snapshot is not None:
            await self.snapshot()
        self.running_since = time.perf_counter()
        try:
            return await self.collect(step, self.version)
        finally:
            self.spans.append((self.running_since, time.perf_counter()))
            self.running_since = None

    async def next(self) -> Batch:
        batch = await self.queued.popleft()
        assert batch is not None, "a rollout after a stop or a failure is never read"
        return batch

    def busy(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` during which a rollout ran."""
        spans = list(self.spans)
        if self.running_since is not None:
            spans.append((self.running_since, end))
        total = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
        self.spans = [(a, b) for a, b in self.spans if b > start]  # older ones are done
        return total

    async def close(self, *, cancel: bool) -> None:
        """Wait for the rollouts left (``cancel``: cancel them first); none starts after. The
        error of one that failed is logged (``rollout_discarded``): the loop never reads it."""
        self.closed = True
        for task in self.queued if cancel else ():
            task.cancel()
        ends = await asyncio.gather(*self.queued, return_exceptions=True)
        for task, end in zip(self.queued, ends, strict=True):
            if isinstance(end, Exception):
                error = f"{type(end).__name__}: {end}"
                structlog.get_logger().warning(
                    "rollout_discarded", rollout=task.get_name(), error=error
                )
