"""The pipelined driver of ``train`` (``train.max_staleness > 0``): step ``s + 1``'s rollouts
run while step ``s`` is learned, over the same ``collect``, ``learn`` and ``record`` as the
plain loop of :func:`searchr1.core.train.train`.

Two coroutines share the event loop: the **collector** rolls out step after step, the
**learner** takes collected steps strictly in order, awaits ``learn`` (the trainer computes
off the loop, so the collector's rollouts go on meanwhile) and then ``finish`` (periodic
eval, record, checkpoint).

The *policy version* is the number of optimizer steps the weights have taken. Step ``s`` is
learned on version ``s - 1``; its rollouts may start once version ``s - 1 - max_staleness``
exists. ``0`` is the plain loop's order; ``1`` rolls out step ``s + 1`` on version ``s - 1`` while step ``s`` trains (with
``k >= 2`` the version depends on timing, so runs are not bit-reproducible). The importance
ratio divides by the log-probs the sampler recorded, so stale data stays correct; the health
checks get each step's staleness to tell drift from lag. A slow group is never dropped (that
biases training toward fast questions): the collector waits.

A trainer that declares ``snapshot_sampler`` gets it called at the start of every rollout
when ``max_staleness > 0``, so a rollout samples one version however the learner moves.
``is_barrier(s)`` ("step ``s`` writes a checkpoint") holds the collector until step ``s`` is
finished, so a run resumed from that checkpoint repeats the uninterrupted run. On a stop the
rollout in flight is finished and discarded.

Each step's window metrics (:func:`searchr1.core.step.window_metrics`) span from the end of
the previous step to the end of this step's learning.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from searchr1.core.step import Batch, Learned, window_metrics

Collect = Callable[[int, int], Awaitable[Batch]]  # (step, policy version)
Learn = Callable[[Batch], Awaitable[Learned]]
Finish = Callable[[Batch, Learned, dict[str, float]], Awaitable[None]]


@dataclass
class _Done:
    """The collector's last queue item: it stopped (``error`` set: it failed)."""

    error: BaseException | None = None


@dataclass
class BusyClock:
    """When rollouts ran (``perf_counter`` intervals), to measure idle time per window."""

    rollouts: list[tuple[float, float]] = field(default_factory=list)
    running_since: float | None = None

    def busy(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` during which a rollout ran."""
        spans = list(self.rollouts)
        if self.running_since is not None:
            spans.append((self.running_since, end))
        total = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
        self.rollouts = [(a, b) for a, b in self.rollouts if b > start]  # older ones are done
        return total


async def run_steps(
    *,
    first: int,
    last: int,
    max_staleness: int,
    collect: Collect,
    learn: Learn,
    finish: Finish,
    is_barrier: Callable[[int], bool],
    stopping: Callable[[], bool],
    snapshot: Callable[[], Awaitable[None]] | None,
) -> None:
    """Collect and learn steps ``first..last``.

    Stops early after the step during which ``stopping()`` turned true. An exception in
    ``collect`` is raised once every step collected before it has been learned; one in
    ``learn`` or ``finish`` stops the collector first."""
    version = first - 1
    changed = asyncio.Condition()
    queue: asyncio.Queue[Batch | _Done] = asyncio.Queue()
    clock = BusyClock()

    def may_start(step: int) -> bool:
        if stopping():
            return True
        if is_barrier(step - 1):
            return version >= step - 1
        return version >= step - 1 - max_staleness

    async def collector() -> None:
        try:
            for step in range(first, last + 1):
                async with changed:
                    await changed.wait_for(lambda s=step: may_start(s))
                if stopping():
                    break
                if snapshot is not None and max_staleness > 0:
                    await snapshot()
                clock.running_since = time.perf_counter()
                collected = await collect(step, version)
                clock.rollouts.append((clock.running_since, time.perf_counter()))
                clock.running_since = None
                queue.put_nowait(collected)
            queue.put_nowait(_Done())
        except Exception as exc:  # noqa: BLE001 - raised by the learner, in step order
            queue.put_nowait(_Done(exc))

    task = asyncio.create_task(collector(), name="searchr1-collector")
    try:
        window = time.perf_counter()
        while True:
            item = await queue.get()
            if isinstance(item, _Done):
                if item.error is not None:
                    raise item.error
                break
            t0 = time.perf_counter()
            learned = await learn(item)
            t1 = time.perf_counter()
            busy, overlap = clock.busy(window, t1), clock.busy(t0, t1)
            timing = window_metrics(item, window, t0, t1, rollout_busy=busy, overlap=overlap)
            await finish(item, learned, timing)  # the periodic held-out eval runs in this loop
            window = time.perf_counter()
            async with changed:
                version += 1
                changed.notify_all()
            if stopping():
                break
    except BaseException:
        task.cancel()
        raise
    finally:
        # On a stop the rollout in flight is finished (deterministically) and discarded; a
        # collector waiting for its turn wakes up, sees the stop and ends.
        async with changed:
            changed.notify_all()
        await asyncio.gather(task, return_exceptions=True)
    if snapshot is not None and max_staleness > 0:
        await snapshot()  # what samples next (the held-out eval "after") sees the trained weights
