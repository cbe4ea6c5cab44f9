"""SIGINT/SIGTERM end every phase of a command at its next unit of work: a real signal at a
real phase of a ``searchr1`` process (the JSON events on its stdout say which phase it is
in). Each stop exits 128 + the signal without a traceback, says what was kept and the command
that goes on; that command works. ``bench/stop_latency.py`` measures how long each takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_run import make_config, read_events

# each test runs searchr1 (torch, the tiny model) in a process of its own
pytestmark = pytest.mark.slow

#: the offline world's 320 held-out questions: ten eval batches on the tiny model
HELDOUT = "builtin:world/heldout.jsonl"
#: no eval, no cold start: only RL steps
PLAIN: dict[str, Any] = {"train": {"eval_before_after": False, "max_steps": 3, "save_every": 3}}


class Command:
    """A ``searchr1`` process whose stdout and stderr are read line by line."""

    def __init__(self, *args: str | Path, cwd: Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "searchr1", *map(str, args)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool] | str) -> None:
        """Read until an event ``wanted`` holds for (or a line holding the text ``wanted``)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if isinstance(wanted, str):
                if wanted in line:
                    return
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and wanted(event):
                return
        raise AssertionError(f"exited ({self.proc.wait()}) first:\n{self.output()}")

    def stop(self, sig: signal.Signals) -> tuple[int, str]:
        """Send ``sig``; the exit code and everything printed."""
        self.proc.send_signal(sig)
        return self.finish()

    def finish(self) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=300)  # a guard against a hang, not a speed check
        self.lines.append(out)
        return self.proc.returncode, self.output()

    def output(self) -> str:
        return "".join(self.lines)


def event(name: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


def kept_and_next(out: str) -> tuple[str, str]:
    """The ``kept:`` line of the stop message and the command between backquotes after it."""
    lines = out[out.index("searchr1: stopped by") :].splitlines()
    kept = next(line for line in lines if line.startswith("kept: "))
    follow = next(line for line in lines if "`" in line)
    return kept, follow.split("`")[1]


def as_args(command: str) -> list[str]:
    assert command.startswith("searchr1 ")
    return command.split()[1:]


def test_sigint_in_the_heldout_eval_stops_it_and_says_how_to_start_again(
    tmp_path: Path, config_file
) -> None:
    """The eval "before" runs ten eval batches; a SIGINT as it begins ends it (no score, no
    ceiling eval, no step), exit 130, and names the command that starts the run again."""
    cfg = config_file(make_config(train={"eval_before_after": True}, data={"eval": HELDOUT}))
    run_dir = tmp_path / "run"
    command = Command("train", "--config", cfg, "--run-dir", run_dir, cwd=tmp_path)
    command.wait_for(event("progress", task="held-out eval before", done=0))
    code, out = command.stop(signal.SIGINT)
    assert code == 130, out
    assert 'stopped by SIGINT during the held-out eval "before"' in out
    assert "Traceback" not in out
    kept, again = kept_and_next(out)
    assert "nothing" in kept and "--resume" not in again and str(run_dir) in again
    events = read_events(run_dir)
    done = [e["done"] for e in events if e.get("task") == "held-out eval before"]
    assert max(done, default=0) < 320 and not any(e["event"] == "eval/heldout_em" for e in events)
    assert not any(e["event"] == "metrics" for e in events)
    assert [e["phase"] for e in events if e["event"] == "stopped"] == ['the held-out eval "before"']


def test_sigterm_in_the_cold_start_ends_it_after_the_current_step(
    tmp_path: Path, config_file
) -> None:
    cfg = config_file(
        make_config(PLAIN, train={"cold_start": {"steps": 4, "questions_per_step": 8}})
    )
    run_dir = tmp_path / "run"
    command = Command("train", "--config", cfg, "--run-dir", run_dir, cwd=tmp_path)
    command.wait_for(event("cold_start.step", step=1))
    code, out = command.stop(signal.SIGTERM)
    assert code == 143, out
    assert "stopped by SIGTERM during the cold start (step " in out
    assert "Traceback" not in out and "nothing" in kept_and_next(out)[0]
    # the signal lands in step 2's rollouts (cut) or its learner update (step 3 not begun)
    steps = [e["step"] for e in read_events(run_dir, "cold_start.step")]
    assert steps in ([1], [1, 2])
    assert not read_events(run_dir, "cold_start_done") and not (run_dir / "checkpoints").exists()


def test_sigint_in_a_periodic_eval_keeps_the_step_and_resume_goes_on_from_it(
    tmp_path: Path, config_file
) -> None:
    """Step 1 changed the weights: its periodic eval is cut short as it begins, step 1 is
    recorded and checkpointed, and ``--resume`` starts from that checkpoint."""
    cfg = config_file(
        make_config(
            train={"max_steps": 1, "eval_every": 1, "eval_questions": 32}, data={"eval": HELDOUT}
        )
    )
    run_dir = tmp_path / "run"
    command = Command("train", "--config", cfg, "--run-dir", run_dir, cwd=tmp_path)
    command.wait_for(event("progress", task="held-out eval step_1", done=0))
    code, out = command.stop(signal.SIGINT)
    assert code == 130, out
    assert "stopped by SIGINT during the held-out eval of step 1" in out
    kept, again = kept_and_next(out)
    assert f"checkpoint step 1 ({run_dir / 'checkpoints' / 'step_000001'})" in kept
    assert "--resume" in again
    steps = {e["step"]: e for e in read_events(run_dir, "metrics")}
    assert list(steps) == [1] and "eval/heldout_em" not in steps[1]

    resumed = Command(*as_args(again), cwd=tmp_path)
    code, out = resumed.finish()
    assert code == 0, out
    assert [e["step"] for e in read_events(run_dir, "resumed")] == [1]


def test_a_second_sigint_exits_at_once(tmp_path: Path, config_file) -> None:
    """The first SIGINT lets the RL step finish; the second ends the process at once: exit
    130, no traceback, and it says what the folder keeps (the last complete checkpoint) and
    the command that continues from it; that command does."""
    config = config_file(
        make_config(
            PLAIN, rollout={"questions_per_batch": 4, "group_size": 4}, train={"save_every": 1}
        )
    )
    run_dir = tmp_path / "run"
    command = Command("train", "--config", config, "--run-dir", run_dir, cwd=tmp_path)
    command.wait_for(event("checkpoint", step=1))  # step 2 starts
    command.proc.send_signal(signal.SIGINT)
    command.wait_for("Ctrl-C again exits at once")
    code, out = command.stop(signal.SIGINT)
    assert code == 130, out
    assert "Traceback" not in out
    (said,) = [line for line in out.splitlines() if "stopped at once by a second SIGINT" in line]
    last = read_events(run_dir, "checkpoint")[-1]  # step 2 may have ended in between
    assert said == (
        f"searchr1: stopped at once by a second SIGINT; kept: checkpoint step {last['step']} "
        f"({last['path']}); continue with `searchr1 train --resume --run-dir {run_dir} "
        f"--config {config}`"
    ), out
    resumed = Command(*as_args(said.split("`")[1]), cwd=tmp_path)
    code, out = resumed.finish()
    assert code == 0, out
    assert [e["step"] for e in read_events(run_dir, "resumed")] == [last["step"]]


def test_eval_and_smoke_stop_mid_phase(tmp_path: Path, config_file) -> None:
    """``searchr1 eval``: SIGTERM in the first of ten eval batches, exit 143; ``searchr1
    smoke``: SIGINT during its model load, exit 130."""
    cfg = config_file(make_config(data={"eval": HELDOUT}))
    evaluation = Command("eval", "--config", cfg, "--run-dir", tmp_path / "e", cwd=tmp_path)
    evaluation.wait_for(event("eval_start"))
    code, out = evaluation.stop(signal.SIGTERM)
    assert code == 143, out
    assert "stopped by SIGTERM during the eval of base" in out and "Traceback" not in out
    kept, again = kept_and_next(out)
    assert "nothing" in kept and again.startswith("searchr1 eval --config")
    assert not (tmp_path / "e" / "eval_base.jsonl").exists()

    smoke = Command("smoke", "--config", cfg, "--run-dir", tmp_path / "s", cwd=tmp_path)
    smoke.wait_for("search keys:")  # printed just before the providers start
    code, out = smoke.stop(signal.SIGINT)
    assert code == 130, out
    assert "stopped by SIGINT during the model load (builtin:tiny)" in out
    assert "Traceback" not in out and "smoke: " not in out  # no verdict
    kept, again = kept_and_next(out)
    assert "nothing" in kept and again.startswith("searchr1 smoke --config")


def test_index_build_saves_what_it_encoded_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("wordllama")
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(10_000):
            row = {"id": str(i), "contents": f"Passage {i}: the river Ros{i % 13} at Vel{i % 97}"}
            f.write(json.dumps(row) + "\n")
    out_dir = tmp_path / "idx"
    build = Command("index", "build", corpus, "--out", out_dir, cwd=tmp_path)
    build.wait_for(event("index_progress"))  # the first report, before any passage
    code, out = build.stop(signal.SIGINT)
    assert code == 130, out
    assert "stopped by SIGINT during the index build" in out and "Traceback" not in out
    kept, again = kept_and_next(out)
    state = json.loads((out_dir / ".build" / "state.json").read_text())
    assert 0 < state["rows"] < 10_000 and f"{state['rows']} encoded passages" in kept

    resumed = Command(*as_args(again), cwd=tmp_path)
    code, out = resumed.finish()
    assert code == 0, out
    assert "resumed" in out
    assert json.loads((out_dir / "card.json").read_text())["count"] == 10_000
