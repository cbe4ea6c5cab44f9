"""The step pipeline: step ``s + 1``'s rollouts run while step ``s`` is learned.

:func:`searchr1.core.train.train` calls :func:`run_steps` once per run. Two coroutines share
the event loop:

* the **collector** rolls out step after step (``collect``, a coroutine: sampling and search);
* the **learner** takes the collected steps strictly in order and runs ``learn`` (the
  trainer's blocking ``forward_backward`` / ``optim_step``) in a worker thread, then
  ``finish`` (metrics, checkpoints) back in the loop.

Versions and staleness. The *policy version* is the number of optimizer steps the weights have
taken (a resumed run starts at its checkpoint's step). Step ``s`` is learned on version
``s - 1``; its rollouts may start once version ``s - 1 - max_staleness`` exists, on the newest
weights available then, and the trajectories record that version. So ``max_staleness = 0`` is
the synchronous loop (collect, learn, collect, ...), and ``max_staleness = 1`` starts step
``s + 1``'s rollouts as soon as step ``s``'s are done, on version ``s - 1``, while step ``s``
trains: its data is exactly one version old. (With ``k >= 2`` which version is the newest
when a rollout starts depends on timing, so such runs are not reproducible bit for bit.)
Off-policy data is corrected by the loss: the importance ratio divides by the log-probs the
sampler recorded, whichever weights that was. So on a stale step ``mismatch/*`` also measure
the policy's change over the lag; step monitors get each step's staleness
(:meth:`~searchr1.core.types.StepMonitor.observe`) to tell one from the other.

Pacing, never dropping. A slow group is never discarded (that biases training toward fast
questions); instead the collector waits when it is ``max_staleness`` steps ahead.

Snapshots. A trainer whose sampler would otherwise follow it mid-rollout declares a
``snapshot_sampler`` (:attr:`~searchr1.core.types.TrainerCapabilities.snapshot_sampler`; an
in-process learner keeps a copy of its LoRA tensors, a served sampler pins one adapter, a
remote service keeps one sampling client), passed here as ``snapshot``: the collector
calls it at the start of every rollout when ``max_staleness > 0``, so the whole rollout samples
one version however the learner moves meanwhile. With ``snapshot = None`` the rollout may
sample a trajectory's later turns on a newer version than it records; its log-probs are still
the sampler's own, so the ratio stays correct, only ``staleness/*`` under-reports.

Checkpoints are exact. ``is_barrier(s)`` (the loop passes "step ``s`` writes a checkpoint")
holds the collector until step ``s`` is learned and finished, so nothing is in flight when a
checkpoint is written, and the step after it samples on the checkpoint's weights: a run
resumed from there repeats what the uninterrupted run did (one pipeline bubble per
``save_every`` steps is the price). On SIGINT/SIGTERM the rollout in flight is finished and
discarded; the checkpoint records the data cursor of the last learned step, so a resumed run
redraws those questions (on the newest weights).

Metrics (merged into each step's ``metrics`` event), over the step's window (from the end of
the previous step to the end of this step's learning)::

    staleness/mean, staleness/max    learned-on version minus sampled-with version
    pipeline/trainer_idle_frac       share of the window the learner waited for rollouts
    pipeline/sampler_idle_frac       share of the window no rollout was running
    pipeline/overlap_s               seconds a rollout ran while this step was learned
    time/step                        the window
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from searchr1.core.step import CollectedStep, Learned

Collect = Callable[[int, int], Awaitable[CollectedStep]]  # (step, policy version)
Learn = Callable[[CollectedStep], Learned]  # blocking; runs in a worker thread
Finish = Callable[[CollectedStep, Learned, dict[str, float]], None]


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
    snapshot: Callable[[], None] | None,
) -> CollectedStep | None:
    """Collect and learn steps ``first..last``; returns the last learned step (None if none).

    Stops early after the step during which ``stopping()`` turned true. An exception in
    ``collect`` is raised once every step collected before it has been learned; one in
    ``learn`` or ``finish`` stops the collector first."""
    version = first - 1
    changed = asyncio.Condition()
    queue: asyncio.Queue[CollectedStep | _Done] = asyncio.Queue()
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
                    snapshot()
                clock.running_since = time.perf_counter()
                collected = await collect(step, version)
                clock.rollouts.append((clock.running_since, time.perf_counter()))
                clock.running_since = None
                queue.put_nowait(collected)
            queue.put_nowait(_Done())
        except Exception as exc:  # noqa: BLE001 - raised by the learner, in step order
            queue.put_nowait(_Done(exc))

    task = asyncio.create_task(collector(), name="searchr1-collector")
    learned_last: CollectedStep | None = None
    try:
        window = time.perf_counter()
        while True:
            item = await queue.get()
            if isinstance(item, _Done):
                if item.error is not None:
                    raise item.error
                break
            t0 = time.perf_counter()
            learned = await asyncio.to_thread(learn, item)
            t1 = time.perf_counter()
            finish(item, learned, _window_metrics(item, clock, window, t0, t1))
            learned_last = item
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
        snapshot()  # what samples next (the held-out eval "after") sees the trained weights
    return learned_last


def _window_metrics(
    collected: CollectedStep, clock: BusyClock, start: float, t0: float, t1: float
) -> dict[str, float]:
    window = max(t1 - start, 1e-9)
    trained_on = collected.step - 1
    stale = [trained_on - t.policy_version for g in collected.groups for t in g.trajectories] or [
        trained_on - collected.policy_version
    ]
    return {
        "staleness/mean": sum(stale) / len(stale),
        "staleness/max": float(max(stale)),
        "pipeline/trainer_idle_frac": min(1.0, max(0.0, 1.0 - (t1 - t0) / window)),
        "pipeline/sampler_idle_frac": min(1.0, max(0.0, 1.0 - clock.busy(start, t1) / window)),
        "pipeline/overlap_s": clock.busy(t0, t1),
        "time/step": window,
    }
