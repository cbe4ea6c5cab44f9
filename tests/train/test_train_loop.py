"""The train loop end to end on the tiny model: metrics, checkpoints, resume, signals, guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import make_config, read_events
from metric_docs import undocumented
from numerics import LOGPROB_TOL_F32
from train_configs import TINY_TRAIN as RUN

from searchr1.core.metric_schema import Kind, declared
from searchr1.core.step_metrics import logprob_diff_max

# every test trains the tiny model in a `searchr1 train` process (20-70 s each on 2 cores)
pytestmark = pytest.mark.slow


STEP_KEYS = (
    "reward/mean",
    "reward/format",
    "reward/correct",
    "search/success_rate",
    "search/calls",
    "searches_per_trajectory",
    "degenerate_group_rate",
    "tokens/trained",
    "loss",
    "ratio_mean",
    "time/rollout",
    "time/train",
    "time/step",
    "memory/peak_rss_gb",
    "health/response_tokens",
)


def _train(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "searchr1.cli", "train", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _step_metrics(run_dir: Path) -> dict[int, dict]:
    """The last metrics event logged for each step (none before the run logs anything)."""
    if not (run_dir / "events.jsonl").exists():
        return {}
    return {e["step"]: e for e in read_events(run_dir, "metrics")}


def _comparable(m: dict) -> dict:
    """The numbers of a metrics event that must not depend on timing. The run's query cache
    lives in memory, so a resumed run starts it empty: its hit counters (and the attempts they
    save) legitimately differ; calls and success rate do not. ``pipeline/*`` are idle times,
    ``memory/*`` the process's own peak."""
    keep_search = ("search/calls", "search/success_rate", "search/error_rate")
    return {
        k: v
        for k, v in m.items()
        if isinstance(v, int | float)
        and not k.startswith(("time/", "pipeline/", "memory/"))
        and (not k.startswith("search/") or k in keep_search)
    }


def _pipelined(tmp_path: Path, staleness: int) -> Path:
    """The test config with ``[train] max_staleness`` set (0: left at its default)."""
    path = tmp_path / "config.toml"
    path.write_text(make_config(RUN, train={"max_staleness": staleness}))
    return path


@pytest.fixture(scope="module")
def uninterrupted_runs(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """``runs(max_staleness)``: the run folder of an uninterrupted run (made once each)."""
    made: dict[int, Path] = {}

    def run(staleness: int) -> Path:
        if staleness not in made:
            tmp = tmp_path_factory.mktemp(f"plain{staleness}")
            config = _pipelined(tmp, staleness)
            proc = _train("--config", str(config), "--run-dir", str(tmp / "run"), cwd=tmp)
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, out
            made[staleness] = tmp / "run"
        return made[staleness]

    return run


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_runs) -> Path:  # noqa: ANN001
    return uninterrupted_runs(0)


def _table_reward(row: dict) -> float:
    """The reference setup's reward table applied to a dumped trajectory's own components."""
    if not row["components"]["format"]:
        return -0.1
    return 1.0 if row["components"]["correct"] else 0.0


def test_every_metric_and_event_the_run_emits_is_in_the_metrics_reference(
    uninterrupted: Path,
) -> None:
    """docs/reference/metrics.md (scripts/metric_docs.py) describes what a real run writes."""
    missing = undocumented(read_events(uninterrupted))
    assert not missing, f"describe these in scripts/metric_docs.py: {missing}"


#: what the local search provider (no HTTP, no keys) must not report
_HTTP_OR_SPEND = ("search/attempts", "search/available", "search/http_429", "search/paid_calls",
                  "search/cache_hits", "search/keys_available", "search/paid_calls_total")  # fmt: skip


def test_the_metrics_event_holds_only_declared_keys_of_present_producers(
    uninterrupted: Path,
) -> None:
    """Every key is in the schema and is neither a constant nor a run total; the local
    search provider reports no HTTP or spend counter, synchronous steps no ``staleness/*``
    or ``pipeline/*``, a loss without clipping no ``clip_fraction``. (That no key of the
    demo is 0 on every step is ``bench/metric_keys.py``'s check of a 60-step demo run.)"""
    steps = read_events(uninterrupted, "metrics")
    keys = {k for m in steps for k in m} - {"event", "run_id", "level", "timestamp"}
    for key in keys:
        found = declared(key)
        assert found is not None, key
        assert found[0].kind not in (Kind.CONSTANT, Kind.DERIVED, Kind.TOTAL), key
    assert not keys & set(_HTTP_OR_SPEND)
    assert not [k for k in keys if k.startswith(("staleness/", "pipeline/"))]
    assert "clip_fraction" not in keys and "optim/lr" not in keys
    # the bookkeeping fields left out; 4 of them the likelihood displacement's, on steps that
    # trained a positively-rewarded response
    assert max(len(m) - 4 for m in steps) <= 44
    (done,) = read_events(uninterrupted, "train_done")
    assert "search/paid_calls_total" not in done  # a keyed service's totals only


def test_each_step_logs_metrics_checkpoints_and_trajectories(uninterrupted: Path) -> None:
    steps = _step_metrics(uninterrupted)
    assert sorted(steps) == [1, 2, 3, 4]
    trained_steps = []
    for step, m in steps.items():
        missing = [k for k in STEP_KEYS if k not in m]
        assert not missing, missing
        assert "groups" not in m  # no KL term: dynamic sampling keeps questions_per_batch
        # Every trained trajectory is dumped (dump_trajectories = 64): the step's numbers
        # must be those of these trajectories.
        path = uninterrupted / "trajectories" / f"step_{step:06d}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 2 * 3
        rewards = [r["reward"] for r in rows]
        assert rewards == pytest.approx([_table_reward(r) for r in rows])
        assert m["reward/trained_mean"] == pytest.approx(sum(rewards) / len(rewards))
        if m["draws/extra"] == 0:  # no redraw: the trained groups are the first draw
            assert m["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
        # Trained tokens: the sampled tokens of trajectories whose advantage is not 0.
        by_group: dict[str, list[dict]] = {}
        for r in rows:
            by_group.setdefault(r["group_id"], []).append(r)
        expected_tokens = 0
        for group in by_group.values():
            mean = sum(r["reward"] for r in group) / len(group)
            expected_tokens += sum(
                r["num_generated_tokens"] for r in group if abs(r["reward"] - mean) > 1e-9
            )
        assert m["tokens/trained"] == expected_tokens
        if expected_tokens:
            trained_steps.append(step)
            # One optimizer step per step, after every micro-batch: each step trains
            # on-policy, so the sampler/learner mismatch (fp32 on CPU) is float noise.
            tol = LOGPROB_TOL_F32
            assert logprob_diff_max(m) < tol
            assert 1 - tol < m["mismatch/ratio_min"] <= m["mismatch/ratio_max"] < 1 + tol
            assert abs(m["mismatch/kl_sample_train"]) < tol and m["mismatch/k3"] >= 0
            assert m["optim/grad_norm"] > 0
        assert m["health/response_tokens"] > 0 and m["health/entropy"] > 0
    # the warm-started model gives mixed rewards, and the updates change the adapter
    assert trained_steps
    checkpoints = sorted(p.name for p in (uninterrupted / "checkpoints").iterdir())
    assert checkpoints == ["step_000002", "step_000004"]
    adapters = [
        next((uninterrupted / "checkpoints" / c).rglob("adapter_model.safetensors")).read_bytes()
        for c in checkpoints
    ]
    assert (adapters[0] != adapters[1]) == any(s > 2 for s in trained_steps)
    ckpt = uninterrupted / "checkpoints" / "step_000004"
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == 4
    assert (ckpt / "config.toml").read_text().count("[train]") == 1
    dumped = (uninterrupted / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    assert "question" in json.loads(dumped[0])


def test_pipelined_steps_record_versions_and_bound_staleness(uninterrupted_runs) -> None:  # noqa: ANN001
    """max_staleness = 1: step s + 1 rolls out on version s - 1 while step s trains, except
    after a checkpoint step (save_every = 2), which nothing outlives in flight."""
    run = uninterrupted_runs(1)
    steps = _step_metrics(run)
    assert sorted(steps) == [1, 2, 3, 4]
    assert [steps[s]["staleness/max"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    for step, m in steps.items():
        rows = (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        versions = {json.loads(r)["policy_version"] for r in rows}
        assert versions == {step - 1 - int(m["staleness/max"])}
        assert m["staleness/mean"] == m["staleness/max"]
        assert 0 <= m["pipeline/trainer_idle_frac"] <= 1
        assert 0 <= m["pipeline/sampler_idle_frac"] <= 1
    # step 2's rollout ran while step 1 trained; nothing ran past the checkpoint at step 2
    assert steps[1]["pipeline/overlap_s"] > 0 and steps[3]["pipeline/overlap_s"] > 0
    assert steps[2]["pipeline/overlap_s"] == 0
    # The ratio is taken against the sampler's own log-probs: a step sampled on the weights
    # before the previous update is off-policy (mismatch), a step after the barrier is not.
    if steps[1]["tokens/trained"] and steps[2]["tokens/trained"]:
        assert logprob_diff_max(steps[2]) > LOGPROB_TOL_F32
    if steps[3]["tokens/trained"]:
        assert logprob_diff_max(steps[3]) < LOGPROB_TOL_F32
    # ... which is not a sampler/learner drift: no mismatch alert on the stale steps
    alerts = [e for e in read_events(run, "health_alert") if e["kind"] == "mismatch"]
    assert not [a for a in alerts if steps[a["step"]]["staleness/max"] > 0]
    assert (
        json.loads((run / "checkpoints" / "step_000004" / "trainer.json").read_text())["step"] == 4
    )


@pytest.mark.parametrize("staleness", [0, 1])
def test_resume_after_sigkill_matches_uninterrupted_run(
    uninterrupted_runs,
    tmp_path: Path,
    staleness: int,  # noqa: ANN001
) -> None:
    """Also with pipelined steps: a checkpoint step is a pipeline barrier, so the resumed run
    samples every step on the same weights version as the uninterrupted one."""
    uninterrupted = uninterrupted_runs(staleness)
    config = _pipelined(tmp_path, staleness)
    run_dir = tmp_path / "run"
    proc = _train("--config", str(config), "--run-dir", str(run_dir), cwd=tmp_path)
    deadline = time.monotonic() + 600
    while 3 not in _step_metrics(run_dir):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed_at = max(_step_metrics(run_dir))
    assert killed_at < 4, "the run finished before it could be killed"

    resumed = _train("--config", str(config), "--run-dir", str(run_dir), "--resume", cwd=tmp_path)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert any(e["event"] == "resumed" and e["step"] == 2 for e in read_events(run_dir))
    expected, got = _step_metrics(uninterrupted), _step_metrics(run_dir)
    for step in (3, 4):
        a, b = _comparable(expected[step]), _comparable(got[step])
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (step, key)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_checkpoints_and_exits_128_plus_signal(
    tmp_path: Path, config_file, sig: signal.Signals, code: int
) -> None:
    run_dir = tmp_path / "run"
    config = config_file(make_config(RUN, train={"max_steps": 50, "save_every": 100}))
    proc = _train("--config", str(config), "--run-dir", str(run_dir), cwd=tmp_path)
    deadline = time.monotonic() + 600
    while 1 not in _step_metrics(run_dir):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    # not 0: `searchr1 train && searchr1 eval` must not go on after Ctrl-C
    assert proc.returncode == code, out
    assert f"stopped by {sig.name}" in out and "--resume" in out
    assert "Traceback" not in out
    last = max(_step_metrics(run_dir))
    assert last < 50
    assert (run_dir / "checkpoints" / f"step_{last:06d}" / "trainer.json").is_file()
    assert any(e["event"] == "stop_requested" for e in read_events(run_dir))


def test_ctrl_c_during_the_search_guards_wait_stops_at_once(tmp_path: Path, config_file) -> None:
    """The guard waits 60 s before retrying a step whose search failed; Ctrl-C in that wait
    ends the run there (exit 130: the step had nothing to keep), not after the wait and its
    retries (it used to end 139 s later with the guard's exit 3, the Ctrl-C unheard)."""
    from search_fakes import Behaviour, start_fake_retriever

    with start_fake_retriever(Behaviour(all_status=503)) as (base_url, server):
        cfg = make_config(
            RUN,
            search={"provider": "search_r1", "api_base": base_url, "max_retries": 0},
            train={"guard_max_waits": 3, "guard_backoff_seconds": 60},
        )
        run_dir = tmp_path / "run"
        proc = _train("--config", str(config_file(cfg)), "--run-dir", str(run_dir), cwd=tmp_path)
        deadline = time.monotonic() + 300
        events = run_dir / "events.jsonl"
        while not (events.is_file() and "guard/no_update" in events.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        (guard,) = read_events(run_dir, "guard/no_update")
        assert guard["retry_in_s"] == 60  # the warning says how long the wait is
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # well inside the 60 s wait
        assert server.records, "the policy never searched; the guard was not exercised"
    assert proc.returncode == 130, out
    assert "stopped by SIGINT during the search guard's wait before retrying step 1" in out
    assert "Traceback" not in out


def test_guard_stops_a_run_whose_search_server_fails(tmp_path: Path, config_file) -> None:
    from search_fakes import Behaviour, start_fake_zhihu

    with start_fake_zhihu(Behaviour(all_status=503)) as (base_url, server):
        cfg = make_config(
            RUN,
            search={
                "provider": "zhihu",
                "api_base": base_url,
                "api_keys": "k-one-1234,k-two-5678",
                "max_retries": 1,
                "timeout_seconds": 2,
            },
            train={"guard_max_waits": 1, "guard_backoff_seconds": 0.05},
            rollout={"questions_per_batch": 4},
        )
        proc = _train(
            "--config", str(config_file(cfg)), "--run-dir", str(tmp_path / "run"), cwd=tmp_path
        )
        out, _ = proc.communicate(timeout=600)
        assert server.records, "the policy never searched; the guard was not exercised"
    assert proc.returncode == 3, out
    assert "training stopped" in out and "search success rate" in out
    tries = "in 2 tries, the first and 1 after waiting 0.05 s (train.guard_max_waits = 1)"
    assert tries in out, out
    events = read_events(tmp_path / "run")
    assert [e["attempt"] for e in events if e["event"] == "guard/no_update"] == [1, 2]
    assert not any(e["event"] == "metrics" for e in events), "an update was applied"
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert (
        "k-one-1234" not in out
        and "k-one-1234" not in (tmp_path / "run" / "events.jsonl").read_text()
    )


def test_the_guards_stop_counts_its_tries_against_the_setting() -> None:
    """``guard_max_waits = 3`` is the first try and 3 after waits: the stop says 4 tries and
    why, next to the setting's own value (it said "after 4 tries" beside a 3)."""
    from searchr1.core.config_schema import Config
    from searchr1.core.step import _guard_tries

    def said(waits: int, backoff: float = 30.0) -> str:
        return _guard_tries(
            Config().replace(train={"guard_max_waits": waits, "guard_backoff_seconds": backoff})
        )

    assert said(3) == (
        "4 tries, the first and 3 after waiting 30 s, 60 s and 120 s (train.guard_max_waits = 3)"
    )
    assert (
        said(1, 0.5) == "2 tries, the first and 1 after waiting 0.5 s (train.guard_max_waits = 1)"
    )
    assert said(0) == "1 try (train.guard_max_waits = 0)"
