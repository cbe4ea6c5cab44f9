"""The step loop's prefetch (``train.max_staleness``, :func:`searchr1.rl.pipeline.run_steps`):
its order, bounds, stops and errors (with timed stand-ins for collect, learn and finish),
and the local provider's pinned sampler weights (real tiny model). The train loop end to end
with ``max_staleness = 1`` (versions, metrics, SIGKILL-resume) is in ``test_train_loop.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import structlog.testing

from searchr1.core.distributed import World
from searchr1.core.errors import EnvironmentDown
from searchr1.core.step import window_metrics
from searchr1.rl.pipeline import Window, run_steps
from searchr1.rl.step import Batch, Learned


class Recorder:
    """Stand-ins for the loop's collect/learn/finish that sleep and log what happened when."""

    def __init__(self, collect_s: float = 0.05, learn_s: float = 0.05) -> None:
        self.collect_s, self.learn_s = collect_s, learn_s
        self.events: list[tuple[str, int, float]] = []
        self.versions: dict[int, int] = {}
        self.metrics: dict[int, dict[str, float]] = {}
        self.snapshots = 0
        self.fail_at: int | None = None
        self.stop_after_learning: int | None = None
        self.stopped = False
        self._lock = threading.Lock()

    def _log(self, what: str, step: int) -> None:
        with self._lock:
            self.events.append((what, step, time.perf_counter()))

    async def collect(self, step: int, version: int) -> Batch:
        self._log("collect_start", step)
        self.versions[step] = version
        await asyncio.sleep(self.collect_s)
        if step == self.fail_at:
            raise EnvironmentDown(f"step {step}: search down")
        self._log("collect_end", step)
        return Batch(step, [], [], 0, {}, {"cursor": step}, version, self.collect_s, [])

    async def learn(self, collected: Batch) -> Learned:
        self._log("learn_start", collected.step)
        await asyncio.sleep(self.learn_s)  # a trainer computes off the event loop
        self._log("learn_end", collected.step)
        return Learned(0.0, {}, {}, self.learn_s)

    async def finish(self, collected: Batch, _learned: Learned, window: Window) -> None:
        self.metrics[collected.step] = window_metrics(collected, window)
        if collected.step == self.stop_after_learning:
            self.stopped = True

    def at(self, what: str, step: int) -> float:
        return next(t for w, s, t in self.events if w == what and s == step)

    def run(self, *, last: int, staleness: int, barriers: tuple[int, ...] = (), first: int = 1):
        return asyncio.run(
            run_steps(
                first,
                last,
                max_staleness=staleness,
                collect=self.collect,
                learn=self.learn,
                finish=self.finish,
                holds=lambda s: s in barriers,
                stopping=lambda: self.stopped,
                snapshot=self._snapshot,
                world=World(),
            )
        )

    async def _snapshot(self) -> None:
        self.snapshots += 1


def test_staleness_zero_is_the_synchronous_loop() -> None:
    r = Recorder()
    r.run(last=4, staleness=0)
    assert sorted(r.metrics) == [1, 2, 3, 4]
    for step in (2, 3, 4):  # each rollout starts after the previous step trained
        assert r.at("collect_start", step) >= r.at("learn_end", step - 1)
    assert r.versions == {1: 0, 2: 1, 3: 2, 4: 3}
    assert all(m["staleness/max"] == 0 for m in r.metrics.values())
    assert r.snapshots == 0  # nothing to pin: sampling never overlaps training
    assert all(m["pipeline/overlap_s"] == 0 for m in r.metrics.values())


def test_staleness_one_overlaps_the_next_rollout_with_training() -> None:
    r = Recorder(collect_s=0.1, learn_s=0.1)
    t0 = time.perf_counter()
    r.run(last=5, staleness=1)
    wall = time.perf_counter() - t0
    for step in (2, 3, 4, 5):  # step s's rollout runs while step s - 1 trains
        assert r.at("collect_start", step) < r.at("learn_end", step - 1)
        if step > 2:  # ... and not before version s - 2 exists
            assert r.at("collect_start", step) >= r.at("learn_end", step - 2)
    assert r.versions == {1: 0, 2: 0, 3: 1, 4: 2, 5: 3}
    assert [r.metrics[s]["staleness/max"] for s in range(1, 6)] == [0, 1, 1, 1, 1]
    assert r.snapshots == 6  # every rollout pins the newest weights, and so does the end
    assert wall < 5 * 0.2 * 0.8, "no overlap: as slow as the synchronous loop"
    overlaps = [r.metrics[s]["pipeline/overlap_s"] for s in (1, 2, 3, 4)]
    assert all(o > 0.05 for o in overlaps)
    for m in r.metrics.values():
        assert 0 <= m["pipeline/trainer_idle_frac"] <= 1
        assert 0 <= m["pipeline/sampler_idle_frac"] <= 1


def test_slow_training_paces_sampling_instead_of_running_ahead() -> None:
    r = Recorder(collect_s=0.01, learn_s=0.1)
    r.run(last=6, staleness=2)
    for step in range(1, 7):
        # never more than max_staleness versions behind, and no step is skipped
        assert (step - 1) - r.versions[step] <= 2
        assert r.metrics[step]["staleness/max"] <= 2
        if step > 3:
            assert r.at("collect_start", step) >= r.at("learn_end", step - 3)
    assert sorted(r.metrics) == [1, 2, 3, 4, 5, 6]
    # the learner never waited after the first rollout; the sampler mostly did
    assert r.metrics[5]["pipeline/trainer_idle_frac"] < 0.3
    assert r.metrics[5]["pipeline/sampler_idle_frac"] > 0.5


def test_a_checkpoint_step_holds_the_next_rollout_until_it_trained() -> None:
    r = Recorder()
    r.run(last=4, staleness=1, barriers=(2,))
    assert r.at("collect_start", 3) >= r.at("learn_end", 2)
    assert r.versions == {1: 0, 2: 0, 3: 2, 4: 2}
    assert r.metrics[2]["pipeline/overlap_s"] == 0  # nothing in flight at the checkpoint


def test_a_resumed_run_counts_versions_from_its_checkpoint() -> None:
    r = Recorder()
    r.run(first=3, last=5, staleness=1)
    assert r.versions == {3: 2, 4: 2, 5: 3}


def test_a_stop_finishes_the_rollout_in_flight_and_learns_no_more() -> None:
    r = Recorder(collect_s=0.05, learn_s=0.1)
    r.stop_after_learning = 2
    r.run(last=10, staleness=1)
    assert sorted(r.metrics) == [1, 2]  # the step in flight at the stop is never learned
    assert ("collect_end", 3, r.at("collect_end", 3)) in r.events  # finished, not cancelled
    assert not any(w == "collect_start" and s > 3 for w, s, _ in r.events)


def test_a_rollout_that_fails_after_the_stop_is_logged_not_dropped() -> None:
    """The stop comes after step 2 while step 3's rollout is in flight; it fails. The run ends
    as stopped (the error is not raised over the stop) and the error is in the events."""
    r = Recorder(collect_s=0.05, learn_s=0.1)
    r.stop_after_learning, r.fail_at = 2, 3
    with structlog.testing.capture_logs() as logged:
        r.run(last=10, staleness=1)
    assert sorted(r.metrics) == [1, 2]
    (discarded,) = [e for e in logged if e["event"] == "rollout_discarded"]
    assert discarded["log_level"] == "warning" and discarded["rollout"] == "rollout-3"
    assert discarded["error"] == "EnvironmentDown: step 3: search down"


def test_a_collect_error_is_raised_after_the_steps_before_it_trained() -> None:
    r = Recorder()
    r.fail_at = 3
    with pytest.raises(EnvironmentDown, match="step 3"):
        r.run(last=5, staleness=1)
    assert sorted(r.metrics) == [1, 2]


def test_no_rollout_starts_after_a_failed_one_while_a_step_learns() -> None:
    """Rollouts 2..4 are prefetched while step 1 learns; 2 fails: neither 3 nor 4 starts."""
    r = Recorder(collect_s=0.01, learn_s=0.3)
    r.fail_at = 2
    with pytest.raises(EnvironmentDown, match="step 2"):
        r.run(last=6, staleness=3)
    assert sorted(r.metrics) == [1]
    assert [s for w, s, _ in r.events if w == "collect_start"] == [1, 2]


def test_a_learn_error_stops_the_collector() -> None:
    r = Recorder()

    async def broken(collected: Batch) -> Learned:
        raise RuntimeError("service gone")

    r.learn = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="service gone"):
        r.run(last=20, staleness=1)
    assert max(s for w, s, _ in r.events if w == "collect_start") <= 3


# ----------------------------------------------------------------- local provider snapshot


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fakes import build_small_tiny_model

    return build_small_tiny_model(tmp_path_factory.mktemp("tiny"))


async def _train_once(p, lr: float = 0.5) -> None:  # noqa: ANN001
    from searchr1.core.types import AdamParams, Datum
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    seq = list(range(10, 30))
    datum = Datum(
        tuple(seq[:-1]),
        tuple(seq[1:]),
        tuple([0.0] * 4 + [-6.0] * 15),
        tuple([0.0] * 4 + [1.0] * 15),
    )
    await p.forward_backward([datum], NamedLoss("importance_sampling", importance_sampling))
    await p.optim_step(AdamParams(learning_rate=lr))


def test_local_sampler_keeps_its_pinned_weights_while_the_learner_steps(
    model_dir: Path, tmp_path: Path
) -> None:
    from searchr1.core.config_schema import Config
    from searchr1.core.types import SamplingParams
    from searchr1.plugins.local_model.provider import LocalModelProvider

    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 1.0},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(config)
    assert p.capabilities.snapshot_sampler == p.snapshot_sampler  # declared, not probed
    prompt, params = [5, 6, 7, 8, 9], SamplingParams(max_tokens=6, temperature=0.0)

    def sample() -> list[float]:
        return list(asyncio.run(p.sample(prompt, 1, params))[0].logprobs)

    base = sample()
    asyncio.run(p.snapshot_sampler())  # version 0
    asyncio.run(_train_once(p))
    assert sample() == base, "the pinned sampler saw the learner's update"
    # the learner trains on its own weights: a second step moves them again
    p.save_state(str(tmp_path / "v1"))
    asyncio.run(p.snapshot_sampler())  # version 1
    v1 = sample()
    assert v1 != base
    asyncio.run(_train_once(p))
    assert sample() == v1
    asyncio.run(p.snapshot_sampler())  # version 2
    assert sample() != v1

    # the checkpoint holds the learner's weights (version 1), not the sampler's copy
    q = LocalModelProvider.from_config(config)
    asyncio.run(q.load_state(str(tmp_path / "v1")))
    assert list(asyncio.run(q.sample(prompt, 1, params))[0].logprobs) == pytest.approx(v1)
    p.close()
    q.close()


def test_local_sampling_while_the_learner_trains_in_its_worker(model_dir: Path) -> None:
    """A rollout samples in the event loop while the learner trains in its worker thread, as
    the prefetching loop runs them: every sample comes from the pinned version."""
    from searchr1.core.config_schema import Config
    from searchr1.core.types import SamplingParams
    from searchr1.plugins.local_model.provider import LocalModelProvider

    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 1.0},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(config)
    prompt, params = [5, 6, 7, 8, 9], SamplingParams(max_tokens=8, temperature=0.0)

    async def main() -> tuple[list[list[float]], list[float]]:
        await p.snapshot_sampler()
        (ref,) = await p.sample(prompt, 1, params)

        async def three_steps() -> None:
            for _ in range(3):
                await _train_once(p)

        training = asyncio.create_task(three_steps())
        seen = []
        while not training.done():
            (s,) = await p.sample(prompt, 1, params)
            seen.append(list(s.logprobs))
        await training
        return seen, list(ref.logprobs)

    seen, ref = asyncio.run(main())
    assert seen and all(s == ref for s in seen)
    asyncio.run(p.snapshot_sampler())
    assert list(asyncio.run(p.sample(prompt, 1, params))[0].logprobs) != ref
    p.close()


def test_a_request_after_a_new_pin_never_joins_a_batch_of_the_old_weights(
    model_dir: Path,
) -> None:
    """The sampler admits queued requests into a running batch; one made after
    ``snapshot_sampler()`` must wait for a batch on the newly pinned weights."""
    from searchr1.core.config_schema import Config
    from searchr1.core.types import SamplingParams
    from searchr1.plugins.local_model.provider import LocalModelProvider

    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 1.0},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(config)
    short = SamplingParams(max_tokens=4, temperature=0.0)
    long = SamplingParams(max_tokens=100, temperature=0.0)

    async def main() -> tuple[list[float], list[float], list[float]]:
        (old,) = await p.sample([5, 6, 7], 1, short)
        await p.snapshot_sampler()  # version 0
        await _train_once(p)  # version 1 published, not pinned yet
        running = asyncio.create_task(p.sample([9, 8, 7, 6], 1, long))
        while p.sampler.stats.batches == 1:  # until the long batch has started
            await asyncio.sleep(0.001)
        await p.snapshot_sampler()  # version 1
        pending = asyncio.create_task(p.sample([5, 6, 7], 1, short))
        await asyncio.sleep(0.02)  # queued while the version-0 batch still runs
        assert not running.done(), "the long batch ended first: nothing was tested"
        (new,) = await pending
        await running
        (again,) = await p.sample([5, 6, 7], 1, short)
        return list(old.logprobs), list(new.logprobs), list(again.logprobs)

    old, new, again = asyncio.run(main())
    assert new == again != old
    p.close()
