"""The LLM judge is contacted before the rollout, like the model and search channels: ``train``
stops at once, before the model loads, with the failure's class and exit code (a rejected key
2, the judge down past its retries 3); ``smoke`` fails (exit 1, a diagnosis naming the judge)
when the judge is unusable or gave no verdict, instead of passing on the fallback's scores. The
judge is a loopback fake OpenAI-compatible server (``tests/helpers/fake_judge_server.py``)."""

from __future__ import annotations

from pathlib import Path

from cli_run import make_config, read_events
from fake_judge_server import KEYS, FakeJudgeServer

SHORT = {"rollout": {"questions_per_batch": 2, "group_size": 3}}
#: a question of the offline world the tiny model answers in the format
ASK = ("--question", "Who founded Nungen Guild?", "--answer", "Vazil Nesfir")


def judge_config(server: FakeJudgeServer, **judge: object) -> str:
    table = {
        "api_base": server.base_url,
        "api_key": "${JUDGE_KEYS}",
        "model": "judge-model",
        "timeout_s": 5.0,
        "max_retries": 0,
        **judge,
    }
    return make_config(SHORT, reward={"name": "judge", "judge": table})


def test_train_with_the_judge_down_stops_before_the_model_loads(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        server.down = True  # 503 to every call
        config = config_file(judge_config(server))
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run)
    said = result.out + result.err
    assert result.code == 3, said[-3000:]
    assert "the reward judge at" in said and "5xx" in said, said[-3000:]
    assert not read_events(run, "local_model_loaded")  # stopped before the model load
    assert not read_events(run, "guard/no_update")  # no step was tried
    (stopped,) = read_events(run, "train_stopped")
    assert (stopped["failure"], stopped["exit_code"]) == ("server_error", 3)
    assert KEYS[0] not in said


def test_train_with_a_rejected_judge_key_exits_2_naming_the_key_setting(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", "sk-not-a-key-of-this-judge")
    with FakeJudgeServer() as server:
        config = config_file(judge_config(server))
        result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    said = result.out + result.err
    assert result.code == 2, said[-3000:]
    assert "the reward judge at" in said and "401/403" in said
    assert "reward.judge.api_key" in said
    assert "sk-not-a-key-of-this-judge" not in said


def test_a_judge_without_verdicts_is_a_config_problem(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        server.fault("reply", "<think>Let me compare the names carefully", times=5)
        config = config_file(judge_config(server))
        result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    said = result.out + result.err
    assert result.code == 2, said[-3000:]
    assert "without a verdict" in said and "reward.judge.max_tokens" in said


def test_smoke_fails_when_the_judge_is_down_although_its_cache_knows_the_answers(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        config = config_file(judge_config(server))
        first = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "up", *ASK)
        assert first.code in (0, 3), first.out + first.err  # the channels work
        assert "diagnosis" not in first.out + first.err
        (checked,) = read_events(tmp_path / "up", "judge_checked")
        assert checked["verdict"] == 1.0  # the golden answer, judged right
        server.down = True  # every verdict of a rerun is on disk; the judge is not
        second = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "down", *ASK)
    said = second.out + second.err
    assert second.code == 1, said[-3000:]
    assert "diagnosis: the reward judge: class server_error" in said
    assert "smoke: FAILED" in said and "smoke: PASS" not in said


def test_smoke_fails_when_the_judge_gives_no_verdict_during_the_rollout(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    with FakeJudgeServer() as server:
        server.fault("hang", 0)  # the check before the rollout is answered...
        server.fault("reply", "I cannot tell.", times=50)  # ...then no verdict
        config = config_file(judge_config(server, disk_cache=False))
        result = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "run", *ASK)
    said = result.out + result.err
    assert result.code == 1, said[-3000:]
    assert "diagnosis: the reward judge at" in said and "gave no verdict" in said, said[-3000:]
    assert "scored by reward.judge.fallback" in said
    assert "smoke: FAILED" in said and "smoke: PASS" not in said
