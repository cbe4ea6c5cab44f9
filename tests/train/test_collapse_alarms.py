"""Collapse seen early: the likelihood displacement the local learner measures around its
optimizer step (checked against the model's own log-probs), the LLDS regularizer (float64
against the formula), and the alarms (likelihood displacement, entropy collapse, search
collapse, lost follow-up searches) firing and naming their remedies. The displacement alarm fires on a real provoked
collapse (a huge learning rate on the tiny model, through ``searchr1 train``); the entropy
and search collapses are scripted signals (a real one takes hundreds of steps)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_run import make_config, read_events
from fakes import build_small_tiny_model
from numerics import random_datums
from trainer_calls import forward_backward, optim_step

from searchr1.core.config_schema import Config, HealthSettings
from searchr1.core.health import HealthMonitor, StepRecord
from searchr1.core.step_metrics import displacement_metrics, llds_metrics
from searchr1.core.types import AdamParams, Datum, RewardResult, Trajectory, Turn
from searchr1.kit.learner.llds import action_segments, llds_penalty, response_segments
from searchr1.kit.learner.loading import LocalSettings
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, cross_entropy, importance_sampling

IS = NamedLoss("importance_sampling", importance_sampling)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_tiny_model(tmp_path_factory.mktemp("tiny"))


def _provider(model_dir: Path, **local: object) -> LocalModelProvider:
    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 0.9, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(config)
    if local:  # the learner's options, as [model.local] sets them
        settings = LocalSettings(**local)  # type: ignore[arg-type]
        p.learner.displacement = settings.likelihood_displacement
        p.learner.llds_coef, p.learner.llds_gate = settings.llds_coef, settings.llds_gate
    with torch.no_grad():  # a LoRA that is not zero, so that every adapter matrix trains
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    return p


def _grouped(vocab: int) -> list[Datum]:
    """Random datums in two groups (ids ``g<k>/<i>`` as the rollout names them), advantages
    1, -1, 0.5, 1, -1, 0.5."""
    return [
        dataclasses.replace(
            d,
            trajectory_id=f"s1d0/g{i % 2}/{i}",
            advantages=tuple(0.0 if a == 0 else (1.0, -1.0, 0.5)[i % 3] for a in d.advantages),
        )
        for i, d in enumerate(random_datums(vocab, n=6, seed=3))
    ]


def _mean_logprob(p: LocalModelProvider, d: Datum) -> float:
    """The datum's mean log-prob per sampled token, straight from the model's logits."""
    with torch.no_grad():
        p.model.eval()
        logits = p.model(input_ids=torch.tensor([d.input_tokens])).logits[0] / 0.9
        lp = torch.log_softmax(logits.double(), -1)
        lp = lp.gather(-1, torch.tensor(d.target_tokens)[:, None])[:, 0]
        return float(lp[torch.tensor(d.sampled)].mean())


def test_displacement_is_the_positive_responses_log_prob_before_and_after_the_step(
    model_dir: Path,
) -> None:
    p = _provider(model_dir)
    datums = _grouped(p.vocab_size)
    positive = [d for d in datums if max(d.advantages) > 0]
    assert 0 < len(positive) < len(datums)
    before = {d.trajectory_id: _mean_logprob(p, d) for d in positive}
    forward_backward(p, datums[:3], IS, 1 / 6)  # two micro-batches: the step's sums add up
    forward_backward(p, datums[3:], IS, 1 / 6)
    out = optim_step(p, AdamParams(learning_rate=1e-2))
    after = {d.trajectory_id: _mean_logprob(p, d) for d in positive}
    m = displacement_metrics(out)
    n = len(positive)
    assert out["displacement/responses"] == n
    assert m["displacement/logprob_before"] == pytest.approx(sum(before.values()) / n, abs=1e-9)
    assert m["displacement/logprob_after"] == pytest.approx(sum(after.values()) / n, abs=1e-9)
    groups = {i: [t for t in before if t.startswith(f"s1d0/g{i}/")] for i in (0, 1)}
    fell = [
        sum(after[t] - before[t] for t in ids) < 0 for ids in groups.values() if ids
    ]  # a group fell when its positive responses' mean change is negative
    assert out["displacement/groups"] == len(fell)
    assert m["displacement/fell_group_frac"] == pytest.approx(sum(fell) / len(fell))
    # nothing measured again on the next step without positive responses, nor when it is off
    negative = [d for d in datums if max(d.advantages) <= 0]
    forward_backward(p, negative, IS, 1.0)
    assert not any(k.startswith("displacement/") for k in optim_step(p, AdamParams(1e-2)))
    p.learner.displacement = False
    forward_backward(p, positive, IS, 1.0)
    assert not any(k.startswith("displacement/") for k in optim_step(p, AdamParams(1e-2)))


def test_train_with_a_huge_learning_rate_raises_the_displacement_alarm(
    tmp_path: Path, config_file, run_cli
) -> None:
    """A real provoked collapse: the demo's (warm-started) tiny model at lr 0.5 pushes the
    responses it rewards from about -0.07 nats a token to about -10 in one step; with
    ``on_alert = "stop"`` the run keeps that step's checkpoint and ends with exit code 5."""
    text = make_config(
        {"rollout": {"questions_per_batch": 2, "group_size": 4}, "optimizer": {"lr": 0.5}},
        train={"max_steps": 3, "health": {"on_alert": "stop"}},
    )
    run = tmp_path / "run"
    result = run_cli("train", "--config", config_file(text), "--run-dir", run)
    assert result.code == 5, result.out + result.err
    assert "health alert likelihood_displacement at step 1" in result.err
    (step,) = read_events(run, "metrics")
    assert step["displacement/delta"] < -1 and step["displacement/fell_group_frac"] > 0.5
    assert step["displacement/logprob_after"] < step["displacement/logprob_before"]
    (alert,) = read_events(run, "health_alert")[:1]
    assert alert["kind"] == "likelihood_displacement"
    message = alert["message"]
    assert "llds_coef" in message and "[optimizer] lr" in message and "kl_coef" in message
    assert (run / "checkpoints" / "step_000001" / "trainer.json").is_file()


def test_a_healthy_step_raises_the_positive_responses_and_no_alarm(
    tmp_path: Path, config_file, run_cli
) -> None:
    text = make_config({"rollout": {"questions_per_batch": 2, "group_size": 4}})
    run = tmp_path / "run"
    result = run_cli("train", "--config", config_file(text), "--run-dir", run)
    assert result.code == 0, result.out + result.err
    measured = [m for m in read_events(run, "metrics") if "displacement/delta" in m]
    assert measured and all(m["displacement/delta"] > 0 for m in measured)
    kinds = {a["kind"] for a in read_events(run, "health_alert")}
    assert "likelihood_displacement" not in kinds


# ------------------------------------------------------------------ LLDS


def _llds_formula(lp, old, adv, units, coef):
    """The penalty written out token by token, in float64 (module docstring of llds.py)."""
    total, tokens = 0.0, 0
    for u in set(units):
        idx = [i for i, x in enumerate(units) if x == u]
        if sum(old[i] - lp[i] for i in idx if adv[i] >= 0) <= 0:
            continue
        for i in idx:
            if adv[i] >= 0 and old[i] - lp[i] > 0:
                total, tokens = total + (old[i] - lp[i]), tokens + 1
    return coef * total, tokens


def test_llds_penalty_and_gradient_equal_the_formula_in_float64() -> None:
    g = torch.Generator().manual_seed(0)
    # two rows: row 0 has two turns (a gap of observation tokens), row 1 one
    trained = torch.tensor(
        [[0, 1, 1, 1, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool
    )
    n = int(trained.sum())
    assert action_segments(trained).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    assert response_segments(trained).tolist() == [0] * 6 + [1] * 5
    old = torch.randn(n, generator=g, dtype=torch.float64) - 2
    adv = torch.tensor([1.0] * 6 + [-0.5] * 3 + [0.0] * 2, dtype=torch.float64)
    for units in (action_segments(trained), response_segments(trained)):
        lp = (old + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_()
        loss, metrics = llds_penalty(lp, old, adv, units, 0.7)
        want, tokens = _llds_formula(lp.tolist(), old.tolist(), adv.tolist(), units.tolist(), 0.7)
        assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
        assert metrics["llds_tokens"] == tokens and metrics["llds_sum"] == pytest.approx(want / 0.7)
        loss.backward()
        grad = torch.zeros(n, dtype=torch.float64)
        for i in range(n):  # d/d lp of coef * (old - lp) on each penalised token
            bumped = lp.detach().clone()
            bumped[i] += 1e-7
            up, _ = _llds_formula(bumped.tolist(), old.tolist(), adv.tolist(), units.tolist(), 0.7)
            grad[i] = (up - want) / 1e-7
        assert torch.allclose(lp.grad, grad, atol=1e-5)


def test_llds_is_added_to_the_learners_loss_and_logged(model_dir: Path) -> None:
    p = _provider(model_dir, llds_coef=0.5, llds_gate="response")
    # sampler log-probs above the learner's: the policy moved since sampling (staleness)
    datums = [
        dataclasses.replace(
            d, sampler_logprobs=tuple(0.0 if a == 0 else -0.01 for a in d.advantages)
        )
        for d in _grouped(p.vocab_size)
    ]
    with_llds = forward_backward(p, datums, IS, 1.0)
    p.learner.optimizer.zero_grad(set_to_none=True)
    p.learner.llds_coef = 0.0
    without = forward_backward(p, datums, IS, 1.0)
    p.learner.optimizer.zero_grad(set_to_none=True)
    m = with_llds.metrics
    assert m["llds_tokens"] > 0 and "llds_sum" not in without.metrics
    assert with_llds.loss == pytest.approx(without.loss + 0.5 * m["llds_sum"], rel=1e-9)
    logged = llds_metrics(m)
    assert logged["llds/penalty"] == pytest.approx(m["llds_sum"] / m["tokens"])
    # every token of a response with advantage >= 0 here fell (sampler -0.01 above the
    # learner's); negative-advantage responses are never regularized
    assert m["llds_tokens"] == sum(sum(d.sampled) for d in datums if max(d.advantages) > 0)
    # the cold start's supervised loss is left alone (its sampler log-probs are 0)
    p.learner.llds_coef = 0.5
    sft = forward_backward(p, datums, NamedLoss("cross_entropy", cross_entropy), 1.0)
    p.learner.optimizer.zero_grad(set_to_none=True)
    assert "llds_sum" not in sft.metrics


# ------------------------------------------------------------------ scripted collapses


def _traj(logprob: float, searches: int) -> Trajectory:
    text = "<answer>a</answer>"
    return Trajectory(
        trajectory_id="t", question="q", golden_answers=("a",), tokens=(1, 2, 3, 4),
        generated_mask=(False, True, True, True), logprobs=(0.0, logprob, logprob, logprob),
        prompt_len=1, turns=(Turn((), text, "answer"),), end_reason="answered",
        final_answer="a", final_text=text, search_calls=searches, search_errors=0,
        data_source="world_2hop", format_ok=True,
    )  # fmt: skip


def _observe(monitor: HealthMonitor, step: int, logprob: float, searches: int) -> list:
    trajs = [_traj(logprob, searches) for _ in range(4)]
    _, alerts = monitor.observe(StepRecord(step, [], trajs, [RewardResult(0.0)] * 4, {}, 0.0))
    return alerts


def test_an_entropy_collapse_alerts_naming_its_remedies() -> None:
    """Scripted: the sampled tokens' -log p falls from 2 nats to 0.05 (a real collapse takes
    hundreds of steps)."""
    monitor = HealthMonitor(HealthSettings(ema=0.5))
    alerts = [a for step, lp in enumerate([-2.0, -2.0, -0.05, -0.05, -0.05], 1)
              for a in _observe(monitor, step, lp, 2)]  # fmt: skip
    assert [a.kind for a in alerts] == ["entropy_cliff"]
    message = alerts[0].message
    assert "entropy collapse" in message
    assert "clip_high" in message and "kl_coef" in message and "[optimizer] lr" in message


def test_a_search_collapse_alerts_naming_its_remedies() -> None:
    """Scripted: two searches per question, then none (the policy guesses)."""
    monitor = HealthMonitor(HealthSettings(ema=0.5))
    alerts = [a for step, n in enumerate([2, 2, 2, 0, 0, 0], 1)
              for a in _observe(monitor, step, -1.0, n)]  # fmt: skip
    assert [a.kind for a in alerts] == ["search_cliff"]
    assert "retrieval_credit" in alerts[0].message and "search/success_rate" in alerts[0].message
    # a policy that hardly searched (peak under 0.5 a question) falling to 0 is noise, not a
    # collapse
    quiet = HealthMonitor(HealthSettings(ema=0.5))
    assert [
        a for step, n in enumerate([0, 1, 0, 0, 0], 1) for a in _observe(quiet, step, -1.0, n)
    ] == []


def test_a_multi_hop_policy_that_stops_at_its_first_search_alerts() -> None:
    """Scripted from the harder world's seed-0 run that lost its two-hop questions
    (docs/benchmarks.md): two searches a question, then one. The searches per question halve
    and stay over the search cliff; the follow-up searches fall to 0 and alert, naming which
    questions to look at and the remedies."""
    monitor = HealthMonitor(HealthSettings(ema=0.3))
    alerts = [a for step, n in enumerate([2] * 8 + [1] * 8, 1)
              for a in _observe(monitor, step, -1.0, n)]  # fmt: skip
    assert [a.kind for a in alerts] == ["follow_up_cliff"]
    assert "health/searches/<data_source>" in alerts[0].message
    assert "retrieval_credit" in alerts[0].message and "only_when_correct" in alerts[0].message
    # a policy that searched again on fewer than about one question in three, then stopped:
    # noise, not a collapse (trajectories of one step: one in four searches twice)
    quiet = HealthMonitor(HealthSettings(ema=0.3))
    for step in range(1, 9):
        trajs = [_traj(-1.0, 2 if step < 4 else 1)] + [_traj(-1.0, 1) for _ in range(3)]
        record = StepRecord(step, [], trajs, [RewardResult(0.0)] * 4, {}, 0.0)
        metrics, alerts = quiet.observe(record)
        assert alerts == []
        assert metrics["health/follow_up_searches"] == (0.25 if step < 4 else 0.0)


def test_the_search_alarms_replay_on_ended_runs(tmp_path: Path) -> None:
    """``bench/alarm_replay.py`` feeds a run's logged searches to the run's own monitor: a run
    that logged ``health/follow_up_searches`` is replayed from it, an older one from its
    searches a trajectory minus one, and a line a crash cut short is skipped."""

    def run(name: str, steps: list[dict[str, float]]) -> None:
        folder = tmp_path / name
        folder.mkdir()
        lines = [json.dumps({"event": "metrics", "step": i, **m}) for i, m in enumerate(steps, 1)]
        (folder / "events.jsonl").write_text("\n".join(lines) + '\n{"event": "metr')

    # two searches a trajectory, then one: the follow-ups' moving average (ema 0.3) is
    # 0.7 ** k of its peak k steps after the fall, under half of it at k = 2 (step 10)
    run("old", [{"searches_per_trajectory": 2.0 if i < 8 else 1.0} for i in range(16)])
    # searches a trajectory flat at 1.5 (its mean minus one never falls), the logged
    # follow-ups 0.5 then 0: only the logged metric shows the fall
    logged = [{"searches_per_trajectory": 1.5, "health/follow_up_searches": 0.5 if i < 8 else 0.0}
              for i in range(16)]  # fmt: skip
    run("new", logged)
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "alarm_replay.py"), str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = {line.split("|")[1].strip(): line.split("|")[2:5] for line in out.splitlines()[2:]}
    assert [c.strip() for c in rows[str(tmp_path / "old")]] == ["16", "-", "10"]
    assert [c.strip() for c in rows[str(tmp_path / "new")]] == ["16", "-", "10"]


def test_the_displacement_alarm_resumes_from_a_checkpointed_state() -> None:
    """Scripted sums: the moving averages go into the checkpoint, so a resumed run alerts
    when the uninterrupted one would."""
    fell = {"displacement/responses": 2.0, "displacement/before_sum": -1.0,
            "displacement/after_sum": -1.4, "displacement/groups": 2.0,
            "displacement/fell_groups": 2.0}  # fmt: skip
    rose = {**fell, "displacement/after_sum": -0.8, "displacement/fell_groups": 0.0}
    first = HealthMonitor(HealthSettings(ema=0.5))
    for step, train in enumerate([rose, rose, rose], 1):
        assert first.observe(StepRecord(step, [], [], [], train, 0.0))[1] == []
    resumed = HealthMonitor(HealthSettings(ema=0.5))
    resumed.load_state(first.state())
    for m in (first, resumed):
        # share 0.5 after one fallen step (not over 0.5); 0.75 after two
        assert m.observe(StepRecord(4, [], [], [], fell, 0.0))[1] == []
        (alert,) = m.observe(StepRecord(5, [], [], [], fell, 0.0))[1]
        assert alert.kind == "likelihood_displacement"
    assert resumed.state() == first.state()
