"""``searchr1 train`` and ``eval`` on the offline demo (the tiny model, shortened) with the
``f1`` reward and with the ``judge`` reward, the judge a loopback fake OpenAI-compatible server
(``tests/helpers/fake_judge_server.py``): the metrics, the spend, the disk cache on a rerun,
the guard when the judge is down, and no key in any output. The example configs pass
``config check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import make_config, read_events
from fake_judge_server import KEYS, FakeJudgeServer

ROOT = Path(__file__).resolve().parents[2]
#: two questions of three trajectories a step
SHORT = {"rollout": {"questions_per_batch": 2, "group_size": 3}}


def judge_config(server: FakeJudgeServer, **judge: object) -> str:
    table = {
        "api_base": server.base_url,
        "api_key": "${JUDGE_KEYS}",
        "model": "judge-model",
        "price_in": 0.5,
        "price_out": 2.0,
        "timeout_s": 5.0,
        "max_retries": 1,
        **judge,
    }
    return make_config(SHORT, reward={"name": "judge", "judge": table})


def outputs(run: Path, *printed: str) -> str:
    """Everything a run left that a person or a tracker reads."""
    kinds = (".jsonl", ".toml", ".json", ".html", ".txt", ".log")
    files = [p for p in run.rglob("*") if p.is_file() and p.suffix in kinds]
    return "".join(printed) + "".join(p.read_text(errors="replace") for p in files)


def test_train_on_f1(tmp_path: Path, config_file, run_cli) -> None:
    config = config_file(make_config(SHORT, reward={"name": "f1"}))
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result.out + result.err
    steps = read_events(run, "metrics")
    assert len(steps) == 2
    for m in steps:  # exact match is still logged next to F1
        assert {"reward/f1", "reward/correct", "reward/format"} <= set(m)
        assert m["reward/f1"] >= m["reward/correct"]
    dumped = [json.loads(line) for p in (run / "trajectories").glob("*.jsonl") for line in p.open()]
    assert dumped
    for t in dumped:  # F1 under the format rule, trajectory by trajectory
        c = t["components"]
        assert t["reward"] == pytest.approx(c["f1"] if c["format"] else -0.1)


def test_train_with_a_judge_pays_once_then_reads_its_cache(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", ",".join(KEYS))
    with FakeJudgeServer() as server:
        config = config_file(judge_config(server))
        first = tmp_path / "first"
        result = run_cli("train", "--config", config, "--run-dir", first)
        assert result.code == 0, result.out + result.err
        steps = read_events(first, "metrics")
        paid = sum(m["judge/calls"] for m in steps)
        assert paid + 1 == len(server.requests) > 1  # the steps' calls and the check before them
        for m in steps:
            assert {"reward/judge", "reward/correct", "reward/f1", "reward/judge_fallbacks"} <= set(
                m
            )
            assert m["reward/judge_fallbacks"] == 0 and m["judge/failures"] == 0
            cost = (m["judge/tokens_in"] * 0.5 + m["judge/tokens_out"] * 2.0) / 1e6
            assert m["judge/cost"] == pytest.approx(cost)
        (done,) = read_events(first, "train_done")  # the run totals, apart from the steps'
        assert done["judge/calls_total"] == paid + 1 and "judge/calls_total" not in steps[-1]
        assert any("reward/judge_vs_em" in m for m in steps)
        # both keys were used in turn
        assert {key for key, _ in server.requests} == set(KEYS)

        # the same run again (a new folder, the same seed): the verdicts come from disk
        second = tmp_path / "second"
        again = run_cli("train", "--config", config, "--run-dir", second)
        assert again.code == 0, again.out + again.err
        rerun = read_events(second, "metrics")
        assert sum(m["judge/calls"] for m in rerun) <= 0.1 * paid
        assert sum(m["judge/disk_hits"] for m in rerun) > 0
        assert len(server.requests) <= 1.1 * paid + 2  # and one check each

        report = run_cli("report", first, "--no-png")
        assert report.code == 0, report.err
        page = (first / "report" / "index.html").read_text()
        # the run totals of train_done: the steps' calls and the check before them
        assert 'id="judge-spend"' in page and f"calls <b>{int(paid) + 1}</b>" in page
        for key in KEYS:
            assert key not in outputs(first, result.out, result.err, report.out, report.err)
            assert key not in outputs(second, again.out, again.err)


def test_a_dead_judge_stops_training_like_a_broken_search(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        server.fault("hang", 0)  # the check before the rollout is answered, then
        server.fault("status", 503, "", times=100)  # the judge fails every call
        text = judge_config(server, max_retries=0, disk_cache=False)
        text = text.replace(
            "[train]\n", "[train]\nguard_max_waits = 1\nguard_backoff_seconds = 0.01\n"
        )
        config = config_file(text)
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 3, result.out + result.err
    said = result.out + result.err
    assert "the reward judge at" in said and "gave no verdict" in said, said[-2000:]
    assert "Fix the reward judge" in said
    assert not read_events(run, "metrics")  # no step trained on fallback scores
    assert len(read_events(run, "guard/no_update")) == 2
    assert KEYS[0] not in outputs(run, result.out, result.err)


def test_eval_scores_with_the_judge_on_request(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        text = judge_config(server).replace('name = "judge"', 'name = "format_answer"')
        config = config_file(text)
        run = tmp_path / "eval"
        result = run_cli(
            "eval", "--config", config, "--run-dir", run, "--data",
            "builtin:world/heldout.jsonl", "--limit-per-source", "2", "--judge",
        )  # fmt: skip
        assert result.code == 0, result.out + result.err
        assert server.requests  # the judge was asked although the reward is exact match
    assert (
        "judge" in result.err and "agrees with EM on" in result.err
    )  # the table: stderr when piped
    records = [json.loads(line) for line in (run / "eval_base.jsonl").read_text().splitlines()]
    assert all("judge" in r for r in records if r["format_ok"] and r["final_answer"])
    (event,) = read_events(run, "eval_result")
    assert "judge" in event and "em" in event and "f1" in event
    (spend,) = read_events(run, "eval_judge")
    assert spend["judge/calls"] + 1 == len(server.requests)  # and the check before


@pytest.mark.parametrize("example", ["f1.toml", "judge-taotoken.toml"])
def test_the_reward_examples_pass_config_check(example: str, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-example-0123456789")
    result = run_cli("config", "check", "--config", ROOT / "examples" / example)
    assert result.code == 0, result.err
    assert "sk-example-0123456789" not in result.out + result.err
