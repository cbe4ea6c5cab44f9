"""A phase declares what a stop does there (``job.phase``, :meth:`searchr1.core.stop.Stop.phase`):
a real SIGINT/SIGTERM to this process cuts the phase's work where it is and ends the command
naming the phase, or, with ``on_stop``, gives that value and lets the caller go on (the periodic
eval: the step is kept). One process here; tests/distributed runs the torchrun side."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
import warnings

import pytest

from searchr1.core.errors import Interrupted
from searchr1.core.stop import Stop
from searchr1.rl.job import Job


def _job() -> tuple[Job, Stop]:
    stop = Stop(second_exits=False)
    return Job(stop=stop), stop


async def _long(done: list[str]) -> dict[str, float]:
    await asyncio.sleep(30)
    done.append("finished")
    return {"eval/heldout_em": 1.0}


def _signal_in(seconds: float, signum: int = signal.SIGINT) -> None:
    asyncio.get_running_loop().call_later(seconds, os.kill, os.getpid(), signum)


def test_a_stop_cuts_the_phase_it_arrives_in_and_ends_the_command_naming_it() -> None:
    job, stop = _job()
    done: list[str] = []

    async def phases() -> None:
        _signal_in(0.1)
        await job.phase('the held-out eval "before"', _long(done), alone=True)
        done.append("went on")

    t0 = time.perf_counter()
    with stop.installed(), pytest.raises(Interrupted) as caught:
        asyncio.run(phases())
    assert caught.value.phase == 'the held-out eval "before"'
    assert caught.value.signum == signal.SIGINT
    assert done == []  # the work was cut, and nothing after the phase ran
    assert time.perf_counter() - t0 < 10  # not the work's 30 s


def test_a_phase_with_on_stop_gives_its_value_and_the_caller_goes_on() -> None:
    job, stop = _job()
    done: list[str] = []
    noted: list[str] = []

    def cut_short(exc: Interrupted) -> dict[str, float]:
        noted.append(exc.phase)
        return {}

    async def step() -> dict[str, float] | None:
        _signal_in(0.1, signal.SIGTERM)
        metrics = await job.phase(
            "the held-out eval of step 3", _long(done), alone=True, on_stop=cut_short
        )
        done.append("recorded")  # the step's record and checkpoint still come
        return metrics

    with stop.installed():
        assert asyncio.run(step()) == {}
    assert noted == ["the held-out eval of step 3"] and done == ["recorded"]
    with pytest.raises(Interrupted):  # the next boundary ends the command
        job.check("the next step")


def test_a_stop_asked_before_a_phase_ends_it_before_its_work_starts() -> None:
    job, stop = _job()
    done: list[str] = []
    with stop.installed(), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        os.kill(os.getpid(), signal.SIGTERM)
        stopped: tuple[str, int] | None = None
        try:
            asyncio.run(job.phase("the cold start (step 2 of 4)", _long(done)))
        except Interrupted as exc:  # (its traceback, which holds the work, goes with it)
            stopped = (exc.phase, exc.signum)
        gc.collect()  # an unawaited coroutine warns when collected
    assert stopped == ("the cold start (step 2 of 4)", signal.SIGTERM) and done == []
    assert not [w for w in warned if "never awaited" in str(w.message)]


def test_a_phase_without_a_stop_returns_its_work_and_a_rank_without_work_passes() -> None:
    job, _ = _job()

    async def quick() -> int:
        return 7

    assert asyncio.run(job.phase("the search guard's wait", quick())) == 7
    assert asyncio.run(job.phase('the held-out eval "after"', None, alone=True)) is None
