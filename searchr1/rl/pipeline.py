"""The steps in order: :func:`run_steps` collects, learns and finishes each, the rollouts of
up to ``max_staleness`` later steps prefetched while a step learns (docs/training.md,
"Pipelined steps"; docs/architecture.md, "The loop").
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

import structlog

from searchr1.core.distributed import World
from searchr1.rl.step import Batch, Learned

Collect = Callable[[int, int], Awaitable[Batch]]  # (step, policy version)
Learn = Callable[[Batch], Awaitable[Learned]]
Finish = Callable[[Batch, Learned, dict[str, float]], Awaitable[None]]


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
    """Collect, learn and finish steps ``first..last`` in order, the rollouts of up to
    ``max_staleness`` later steps prefetched while a step learns.

    Step ``s`` is learned on policy version ``s - 1`` (the optimizer steps taken); its
    rollout starts once version ``s - 1 - max_staleness`` exists, after step ``s - 1``'s
    rollout, and after step ``s - 1`` is finished when ``holds(s - 1)``. With
    ``max_staleness > 0`` every rollout starts with ``snapshot()`` (the sampler pins the
    newest weights), and so does what samples after the loop. After each step every rank
    agrees on ``stopping()`` (``world.any``) and the loop ends on a stop: the rollout in
    flight is finished and discarded, none starts after it. An error in ``collect`` is raised
    once the steps before it are learned; one in ``learn`` or ``finish`` cancels the
    rollouts in flight."""
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
            busy, overlap = rollouts.busy(window, t1), rollouts.busy(t0, t1)
            timing = window_metrics(batch, window, t0, t1, rollout_busy=busy, overlap=overlap)
            await finish(batch, learned, timing)  # the periodic held-out eval runs in this loop
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
    """The rollouts :func:`run_steps` started and has not learned yet, in step order, and
    when rollouts ran (to measure the sampler's idle time per window). One runs at a time,
    each after the one before it: the question stream is read in step order."""

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


def window_metrics(
    batch: Batch,
    start: float,
    learn_start: float,
    learn_end: float,
    *,
    rollout_busy: float | None = None,
    overlap: float = 0.0,
) -> dict[str, float]:
    """The step's window, from ``start`` (the end of the previous step) to the end of this
    step's learning: staleness of its trajectories, idle fractions of trainer and sampler
    (``rollout_busy``: seconds of rollouts in the window, by default all of ``start`` to
    ``learn_start``), seconds of rollouts that overlapped learning, and ``time/step``."""
    if rollout_busy is None:
        rollout_busy = learn_start - start
    window = max(learn_end - start, 1e-9)
    trained_on = batch.step - 1
    stale = [trained_on - t.policy_version for g in batch.groups for t in g.trajectories] or [
        trained_on - batch.policy_version
    ]
    return {
        "staleness/mean": sum(stale) / len(stale),
        "staleness/max": float(max(stale)),
        "pipeline/trainer_idle_frac": min(1.0, max(0.0, 1.0 - (learn_end - learn_start) / window)),
        "pipeline/sampler_idle_frac": min(1.0, max(0.0, 1.0 - rollout_busy / window)),
        "pipeline/overlap_s": overlap,
        "time/step": window,
    }
