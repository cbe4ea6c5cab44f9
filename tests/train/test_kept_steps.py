"""Every stop of ``searchr1 train`` keeps the last trained step, says so and names the command
that continues; that command works. Real loopback services (a Zhihu fake, a judge fake) fail
part-way through a run of the scripted provider (six searches a step): the guard's stop after its waits, a failure no wait mends (every key benched
for the run, a rejected judge key: at once, one warning a key), and a stop before any step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_run import make_config, read_events
from fake_judge_server import KEYS as JUDGE_KEYS
from fake_judge_server import FakeJudgeServer
from search_fakes import Behaviour, start_fake_zhihu
from train_configs import train_config

KEYS = ["zk-first-0000-secret", "zk-second-1111-secret", "zk-third-2222-secret"]
#: the searching script of every group asks three questions, then answers
TURNS = [
    ["<search> prince author </search>", "<search> author birthplace </search>",
     "<search> lyon country </search>", "<answer> France </answer>"],
    ["<answer> Paris </answer>"],
]  # fmt: skip
#: searches the scripted groups make in one step (two groups, one searching script each)
SEARCHES_A_STEP = 6


def config_saving_every(tmp_path: Path, base_url: str, search: str = "", train: str = "") -> Path:
    """Four steps of the scripted provider searching the Zhihu fake at ``base_url`` (no
    cache: six requests a step), a checkpoint every five steps: no step of it is saved
    before the last one but by a stop."""
    config = train_config(tmp_path, train=train, turns=TURNS)
    text = config.read_text().replace(
        "max_steps = 2\nsave_every = 2\n", "max_steps = 4\nsave_every = 5\n"
    )
    head, _, rest = text.partition("[search]\n")
    rest = rest[rest.index("\n[", rest.index("[search.local]")) + 1 :]  # drop the local tables
    zhihu = (
        f'[search]\nprovider = "zhihu"\napi_base = "{base_url}"\napi_keys = "{",".join(KEYS)}"\n'
        f"top_k = 2\ntimeout_seconds = 5\ncache = false\ndisk_cache = false\n{search}\n"
    )
    config.write_text(head + zhihu + rest)
    return config


def kept_and_next(said: str) -> tuple[str, str]:
    """The ``kept:`` line of a stop's message and the command between backquotes after it."""
    lines = said[said.index("kept: ") :].splitlines()
    follow = next(line for line in lines if "`" in line)
    return lines[0], follow.split("`")[1]


def resume(run_cli, command: str):
    assert command.startswith("searchr1 ")
    return run_cli(*command.split()[1:])


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


def test_quota_gone_for_the_run_stops_at_once_keeping_step_2_and_resume_goes_on(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """After two steps every key answers 429 and ``key_cooldown_seconds`` (inf) benches each
    for the run: the guard stops at step 3 at once (no wait: none brings a key back), exit 3,
    with checkpoint 2 kept though save_every is 5; the healed service and the command the
    stop printed finish the run from step 3."""
    behaviour = Behaviour(script=["ok"] * (2 * SEARCHES_A_STEP) + ["429"] * 500)
    with start_fake_zhihu(behaviour) as (base_url, server):
        config = config_saving_every(tmp_path, base_url, train="guard_backoff_seconds = 30\n")
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run)
        said = result.out + result.err
        assert result.code == 3, said
        assert "Traceback" not in said
        assert [m["step"] for m in read_events(run, "metrics")] == [1, 2]
        assert checkpoints(run) == ["step_000002"]
        # no wait: the guard met a failure that no wait mends
        waits = [e for e in read_events(run, "guard/no_update") if "retry_in_s" in e]
        assert not waits
        assert "429" in said and "every key is benched for the run" in said
        benched = read_events(run, "search_key_benched")
        assert sorted(e["key_index"] for e in benched) == [0, 1, 2]  # one warning a key
        kept, command = kept_and_next(said)
        assert "checkpoint step 2" in kept and str(run / "checkpoints" / "step_000002") in kept
        assert command == f"searchr1 train --resume --run-dir {run} --config {config}"
        assert not any(key in said for key in KEYS)

        server.behaviour.script.clear()  # the quota is back
        resumed = resume(run_cli, command)
        assert resumed.code == 0, resumed.out + resumed.err
    assert [m["step"] for m in read_events(run, "metrics")] == [1, 2, 3, 4]
    (resumed_event,) = read_events(run, "resumed")
    assert resumed_event["step"] == 2


def test_the_guard_stop_after_its_waits_keeps_the_last_step_and_resume_goes_on(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """A service that answers 503 from step 3 on is an outage: the guard waits, retries, and
    stops (exit 3); step 2, trained but not saved by save_every, is kept and resumed."""
    behaviour = Behaviour(script=["ok"] * (2 * SEARCHES_A_STEP) + ["503"] * 500)
    with start_fake_zhihu(behaviour) as (base_url, server):
        config = config_saving_every(
            tmp_path,
            base_url,
            search="max_retries = 0\n",
            train="guard_max_waits = 1\nguard_backoff_seconds = 0.01\n",
        )
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run)
        said = result.out + result.err
        assert result.code == 3, said
        assert "training stopped: step 3:" in said
        assert len(read_events(run, "guard/no_update")) == 2  # a wait, then the stop
        assert checkpoints(run) == ["step_000002"]
        kept, command = kept_and_next(said)
        assert "checkpoint step 2" in kept and "--resume" in command

        server.behaviour.script.clear()
        resumed = resume(run_cli, command)
        assert resumed.code == 0, resumed.out + resumed.err
    assert [m["step"] for m in read_events(run, "metrics")] == [1, 2, 3, 4]


def judge_reward(server: FakeJudgeServer) -> str:
    return (
        '[reward]\nname = "judge"\n[reward.judge]\n'
        f'api_base = "{server.base_url}"\napi_key = "${{JUDGE_KEYS}}"\nmodel = "judge-model"\n'
        "timeout_s = 5.0\nmax_retries = 1\ndisk_cache = false\n"
    )


class RevokedAfterCheck(FakeJudgeServer):
    """A judge that answers one call (the check before the rollout), then rejects every key."""

    revoked = False

    def answer(self, key: str, body: dict[str, Any], text: str | None = None) -> dict[str, Any]:
        out = super().answer(key, body, text)
        if not self.revoked:
            self.keys, self.revoked = (), True
        return out


def test_a_rejected_judge_key_stops_at_once_with_exit_2_and_resume_starts_fresh(
    tmp_path: Path, run_cli, scripted_plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judge key the service accepts for the check before the rollout, then revokes (401):
    exit 2 at step 1 at once (no guard wait), one ``judge_key_benched`` warning (no search
    event), the 401 in the message; nothing was trained, so the message says so and gives
    the plain rerun; ``--resume`` there works too (it starts from step 1, with a warning)."""
    monkeypatch.setenv("JUDGE_KEYS", JUDGE_KEYS[0])
    with start_fake_zhihu() as (base_url, _), RevokedAfterCheck() as judge:
        config = config_saving_every(tmp_path, base_url, train="guard_backoff_seconds = 30\n")
        config.write_text(config.read_text() + judge_reward(judge))
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run)
        said = result.out + result.err
        assert result.code == 2, said
        assert "401" in said and "reward.judge.api_key" in said
        assert "rejected or rate limited" not in said
        (benched,) = read_events(run, "judge_key_benched")
        assert benched["key_index"] == 0 and "401" in benched["reason"]
        assert not read_events(run, "search_key_benched")
        assert not [e for e in read_events(run, "guard/no_update") if "retry_in_s" in e]
        assert not read_events(run, "metrics") and not checkpoints(run)
        kept, command = kept_and_next(said)
        assert "nothing" in kept and "no step was trained" in kept
        assert command == f"searchr1 train --run-dir {run} --config {config}"
        assert JUDGE_KEYS[0] not in said

        judge.keys = tuple(JUDGE_KEYS)  # the key accepted again
        resumed = run_cli("train", "--resume", "--run-dir", run, "--config", config)
        assert resumed.code == 0, resumed.out + resumed.err
    (fresh,) = read_events(run, "resume_fresh_start")
    assert "stopped before any checkpoint" in fresh["detail"]
    assert [m["step"] for m in read_events(run, "metrics")] == [1, 2, 3, 4]


def test_the_tiny_model_keeps_its_trained_step_when_the_judge_dies_and_resumes_it(
    tmp_path: Path, config_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real weights: the tiny model trains on a judge's verdicts; once a step's metrics are
    out the judge answers 503 to everything, the guard gives up (exit 3) and the step
    trained last, though save_every is 5, is checkpointed, named, and resumed from with
    the judge back."""
    monkeypatch.setenv("JUDGE_KEYS", JUDGE_KEYS[0])
    judge = {
        "api_key": "${JUDGE_KEYS}", "model": "judge-model", "timeout_s": 5.0,
        "max_retries": 0, "disk_cache": False,
    }  # fmt: skip
    train = {
        "max_steps": 4, "save_every": 5, "eval_before_after": False,
        "guard_max_waits": 1, "guard_backoff_seconds": 0.01,
    }  # fmt: skip
    run = tmp_path / "run"
    with FakeJudgeServer() as server:
        table = {**judge, "api_base": server.base_url}
        config = config_file(
            make_config(
                {"rollout": {"questions_per_batch": 2, "group_size": 3}},
                reward={"name": "judge", "judge": table},
                train=train,
            )
        )
        argv = ["train", "--config", str(config), "--run-dir", str(run)]
        job = subprocess.Popen(
            [sys.executable, "-m", "searchr1", *argv],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert job.stdout is not None
        for line in job.stdout:  # JSON events: stdout is a pipe
            if '"event": "metrics"' in line and json.loads(line).get("step") == 1:
                server.down = True
                break
        out, err = job.communicate(timeout=600)  # a guard against a hang, not a speed check
        said = out + err
        assert job.returncode == 3, said[-3000:]
        trained = [m["step"] for m in read_events(run, "metrics")]
        assert trained and trained == list(range(1, trained[-1] + 1)) and trained[-1] < 4
        last = trained[-1]
        assert checkpoints(run) == [f"step_{last:06d}"]
        assert "gave no verdict" in err
        kept, command = kept_and_next(err)
        assert f"checkpoint step {last} " in kept
        server.down = False
        job = subprocess.run(
            [sys.executable, "-m", "searchr1", *command.split()[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=os.environ,
            timeout=600,
        )
        assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    assert [m["step"] for m in read_events(run, "metrics")] == [1, 2, 3, 4]
    (resumed,) = read_events(run, "resumed")
    assert resumed["step"] == last


def test_a_periodic_eval_failing_after_a_learn_keeps_the_step_its_metrics_line_and_checkpoint(
    tmp_path: Path, run_cli, scripted_plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's service goes away during step 1's periodic eval, after its optimizer step
    (the scripted model's greedy calls fail once it has trained: a test double of a remote
    sampler, as no real one runs here): the run stops with that failure (``train_stopped``),
    and step 1 still has its ``metrics`` line and its checkpoint."""
    import fakes

    from searchr1.core.errors import RemoteConnectionLost

    sample = fakes.ScriptedModel.sample

    async def gone_after_a_learn(self, prompt, num_samples, params):  # type: ignore[no-untyped-def]
        if params.temperature == 0 and self.trained:  # an eval's greedy call, after step 1
            raise RemoteConnectionLost("the model server closed the connection", url="x")
        return await sample(self, prompt, num_samples, params)

    monkeypatch.setattr(fakes.ScriptedModel, "sample", gone_after_a_learn)
    heldout = tmp_path / "train.jsonl"  # (train_config's questions: warned, evaluated)
    config = train_config(tmp_path, train="eval_every = 1\n", extra=f'eval = "{heldout}"\n')
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    said = result.out + result.err
    assert result.code == RemoteConnectionLost.exit_code, said
    assert "the model server closed the connection" in said
    assert [e["when"] for e in read_events(run, "eval/heldout_em")] == ["step_0"]
    (metrics,) = read_events(run, "metrics")
    assert metrics["step"] == 1 and "eval/heldout_em" not in metrics
    assert checkpoints(run) == ["step_000001"]
    (stopped,) = read_events(run, "train_stopped")
    assert stopped["failure"] == RemoteConnectionLost.failure
