"""Health signals: the per-step numbers and the alerts when a run collapses."""

from __future__ import annotations

import math
import random

import pytest

from searchr1.core.config_schema import HealthSettings
from searchr1.core.health import (
    HealthMonitor,
    StepRecord,
    mismatch_alerts,
    policy_metrics,
    repeated_ngram_rate,
)
from searchr1.core.plugins import load_registry
from searchr1.core.step_metrics import ratio_basis
from searchr1.core.types import RewardResult, Trajectory, Turn
from searchr1.kit.protocols.tags import TagsProtocol


def _traj(
    sampled: list[int],
    logprobs: list[float] | None = None,
    *,
    searches: int = 0,
    source: str = "nq",
    prompt: int = 3,
    format_ok: bool = True,
) -> Trajectory:
    """``format_ok``: its one turn answers in the tags format, else it writes two answers
    (the verdict recorded as the rollout records it, by the tags protocol's rule)."""
    lps = logprobs if logprobs is not None else [-1.0] * len(sampled)
    text = "<answer>a</answer>" if format_ok else "<answer>a</answer><answer>b</answer>"
    return Trajectory(
        trajectory_id="t",
        question="q",
        golden_answers=("a",),
        tokens=tuple([1] * prompt + sampled),
        generated_mask=tuple([False] * prompt + [True] * len(sampled)),
        logprobs=tuple([0.0] * prompt + lps),
        prompt_len=prompt,
        turns=(Turn((), text, "answer"),),
        end_reason="answered",
        final_answer="a",
        final_text="",
        search_calls=searches,
        search_errors=0,
        data_source=source,
        format_ok=TagsProtocol.answered_in_format([text], "a"),
    )


def _reward(format_ok: bool) -> RewardResult:
    return RewardResult(reward=1.0 if format_ok else -0.1, components={"format": float(format_ok)})


def _monitor(settings: HealthSettings) -> HealthMonitor:
    return HealthMonitor(settings)


def test_repeated_ngrams_count_only_repeats_within_the_sequence() -> None:
    assert repeated_ngram_rate([1, 2, 3, 4, 5, 6], 2) == (0, 5)
    assert repeated_ngram_rate([1, 2, 1, 2, 1, 2], 2) == (3, 5)  # 12 21 [12] [21] [12]
    assert repeated_ngram_rate([7, 7, 7], 4) == (0, 0)


def test_policy_metrics_of_a_step() -> None:
    loop = [5, 6, 7, 8] * 4  # 16 tokens, 13 4-grams of which 9 repeat
    fresh = list(range(10, 26))
    metrics = policy_metrics(
        [
            _traj(loop, [-0.5] * 16, searches=2, source="world_2hop"),
            _traj(fresh, [-1.5] * 16, searches=1, source="world_1hop", format_ok=False),
            _traj(fresh[:8], [-1.0] * 8, searches=3, source="world_2hop"),
        ],
    )
    assert metrics["health/response_tokens"] == pytest.approx(40 / 3)  # prompts not counted
    assert metrics["health/repeat_ngram_rate"] == pytest.approx(9 / (13 + 13 + 5))
    assert metrics["health/entropy"] == pytest.approx((8 + 24 + 8) / 40)
    assert metrics["health/format_rate"] == pytest.approx(2 / 3)
    assert metrics["health/searches/world_2hop"] == 2.5
    assert metrics["health/searches/world_1hop"] == 1.0
    assert metrics["health/follow_up_searches"] == 1.0  # (1 + 0 + 2) / 3
    # The format rate is the rollout's recorded verdict (the protocol's rule), whatever the
    # reward reports.


def test_mean_negative_log_prob_of_samples_estimates_the_entropy() -> None:
    probs = [0.5, 0.25, 0.125, 0.125]
    entropy = -sum(p * math.log(p) for p in probs)
    rng = random.Random(0)
    tokens = rng.choices(range(4), weights=probs, k=4000)
    metrics = policy_metrics([_traj(tokens, [math.log(probs[t]) for t in tokens])])
    assert metrics["health/entropy"] == pytest.approx(entropy, abs=0.03)


def _step(monitor: HealthMonitor, length: int, format_ok: float, lp: float):
    n_ok = round(10 * format_ok)
    trajs = [_traj(list(range(length)), [lp] * length, format_ok=i < n_ok) for i in range(10)]
    rewards = [RewardResult(0.0) for _ in range(10)]  # no format component: the protocol's rule
    return monitor.observe(StepRecord(1, [], trajs, rewards, {}, 0.0))


def test_format_cliff_alerts_once_and_length_growth_is_against_the_first_steps() -> None:
    monitor = _monitor(HealthSettings(baseline_steps=2, ema=0.5, max_length_growth=3.0))
    kinds = []
    for length, fmt in [(10, 0.8), (20, 0.9), (20, 0.9), (30, 0.2), (30, 0.1), (30, 0.1)]:
        metrics, alerts = _step(monitor, length, fmt, -1.0)
        kinds.append([a.kind for a in alerts])
    assert kinds == [[], [], [], [], ["format_cliff"], []]
    assert metrics["health/response_growth"] == pytest.approx(30 / 15)
    assert metrics["health/format_drop"] > 0.5 and metrics["health/alerts"] == 0
    _, alerts = _step(monitor, 100, 0.1, -1.0)
    assert [a.kind for a in alerts] == ["length_growth"] and "6.7x" in alerts[0].message


def test_entropy_collapse_alerts_and_survives_a_resume() -> None:
    settings = HealthSettings(ema=0.5)
    monitor = _monitor(settings)
    for _ in range(3):
        _step(monitor, 10, 1.0, -2.0)
    resumed = _monitor(settings)
    resumed.load_state(monitor.state())
    for m in (monitor, resumed):
        _, alerts = _step(m, 10, 1.0, -0.1)
        assert [a.kind for a in alerts] == []  # EMA 1.05 of peak 2.0: not yet
        _, alerts = _step(m, 10, 1.0, -0.1)
        assert [a.kind for a in alerts] == ["entropy_cliff"]
    assert resumed.state() == monitor.state()


def test_mismatch_alert_thresholds() -> None:
    s = HealthSettings(mismatch_warn_k3=0.01, mismatch_warn_ratio=2.0)
    ok = {"mismatch/k3": 1e-4, "mismatch/ratio_min": 0.9, "mismatch/ratio_max": 1.1}
    assert mismatch_alerts(ok, s) == [] and mismatch_alerts({}, s) == []
    for bad in ({"mismatch/k3": 0.02}, {"mismatch/ratio_max": 2.5}, {"mismatch/ratio_min": 0.4}):
        (alert,) = mismatch_alerts({**ok, **bad}, s)
        assert alert.kind == "mismatch" and "ratio_cap" in alert.message
    # a pipelined step learns from samples of older weights: off-policy by design, no alert
    trajs, rewards = [_traj([1, 2, 3], [-1.0] * 3)], [_reward(True)]
    drift = {**ok, "mismatch/k3": 0.5}
    _, fresh = HealthMonitor(s).observe(StepRecord(1, [], trajs, rewards, drift, 0.0))
    _, stale = HealthMonitor(s).observe(StepRecord(1, [], trajs, rewards, drift, 1.0))
    assert [a.kind for a in fresh] == ["mismatch"] and stale == []


def test_ratio_basis_says_what_is_compared() -> None:
    assert "both at temperature 0.8" in ratio_basis(0.8, 0.8)
    remote = ratio_basis(0.8, None)
    assert "the service's own" in remote and "at 0.8" in remote and "mismatch/" in remote


def test_a_checkpoint_state_with_health_under_its_name_resumes_the_health_checks() -> None:
    """A checkpoint keeps the health state under ``health`` and the notices under
    ``run_notices``; one without the notices (an older run) starts them afresh."""
    from searchr1.core.config import parse_config
    from searchr1.core.health import Health

    saved = {
        "step": 4,
        "python_rng": [],
        "data": {},
        "health": {"length_baseline": [12.0], "ema": {"health/entropy": 1.5}},
    }
    health = Health.for_config(parse_config("", source="t.toml", env={}, registry=load_registry()))
    health.load_state(saved)
    state = health.state()
    assert state["health"]["length_baseline"] == [12.0]
    assert state["health"]["ema"] == {"health/entropy": 1.5}
    assert state["run_notices"] == {"counts": {}, "raised": []}


def test_the_advice_for_a_step_of_degenerate_groups_follows_its_cause() -> None:
    """Sampling changes are advised only where more samples could vary the reward: not when
    no trajectory answered in the format (every one gets the same penalty; with turns cut at
    max_new_tokens, that is the fix), nor when every one answered right (the data's)."""
    from searchr1.core.config_schema import Config
    from searchr1.core.health import degenerate_advice
    from searchr1.core.token_limits import LimitHits
    from searchr1.core.types import Question, ScoredGroup

    cfg = Config().replace(rollout={"dynamic_sampling": True}, model={"max_new_tokens": 64})

    def advice(format_ok: bool, *groups_correct: float, turns_cut: int = 0) -> str:
        groups = [
            ScoredGroup(
                Question(id=str(i), question="q", golden_answers=("a",)),
                [_traj([5, 6], format_ok=format_ok)] * 2,
                [RewardResult(c if format_ok else -0.1, {"correct": c})] * 2,
                (0.0, 0.0),
                True,
            )
            for i, c in enumerate(groups_correct)
        ]
        hits = LimitHits(2, turns_cut, 2, 0, max_new_tokens=64, max_trajectory_tokens=999)
        return degenerate_advice(cfg, groups, hits)

    sampling = (
        "raise rollout.max_extra_draws (dynamic sampling draws fresh questions for degenerate "
        "groups), or raise rollout.group_size or model.temperature"
    )
    unformatted = advice(False, 0.0)
    assert unformatted.startswith("No trajectory answered in the protocol's format, so the reward")
    assert "[train.cold_start] steps" in unformatted and "sampling" not in unformatted
    cut = advice(False, 0.0, turns_cut=2)
    assert "Raise model.max_new_tokens (= 64): turns ended at it" in cut
    easy = advice(True, 1.0, 1.0)
    assert easy.startswith("Every trajectory answered right") and "group_size" not in easy
    wrong = advice(True, 0.0)
    assert wrong == (
        "No trajectory answered right: check that search works (search/success_rate) and that "
        "the corpus answers the questions; then " + sampling
    )
    assert advice(True, 1.0, 0.0) == sampling[0].upper() + sampling[1:]  # groups that agreed
