"""``searchr1 train`` as a torchrun job of 2 processes (gloo on CPU) on the tiny model: the
update equals one process's on fixed datums, rank 0 alone writes one metrics event per step
counting every rank's trajectories (and prints JSON events only, saying its config once), the
questions drawn do not depend on the world size, a 2-rank run resumes on 1 process, a killed
rank ends the job with a clear error, and ``--nproc`` exits as searchr1 does (2 for a config
error, 130 for Ctrl-C) with its message once and none of torchrun's report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_run import make_config, write_config
from fakes import build_small_tiny_model
from numerics import assert_same64

from searchr1.core.checkpoint import list_checkpoints, read_checkpoint

HERE = Path(__file__).parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]

#: three questions a step over two ranks: shares of 1 and 2 groups
RUN: dict[str, dict[str, Any]] = {
    "model": {"temperature": 1.0, "max_new_tokens": 16},
    "rollout": {"questions_per_batch": 3, "group_size": 2, "dynamic_sampling": False},
    "train": {"max_steps": 2, "save_every": 2, "dump_trajectories": 64},
    "optimizer": {"lr": 5e-3},
}


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # one thread a process (2 cores here); the marker finds this test's processes
    return {**env, "OMP_NUM_THREADS": "1", "SEARCHR1_TEST_JOB": str(tmp_path)}


def _train(tmp_path: Path, *args: str | Path, nproc: int = 1) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "searchr1", "train", *map(str, args)]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    return subprocess.run(
        command, capture_output=True, text=True, env=_env(tmp_path), timeout=600, check=False
    )


def _assert_piped_output(job: subprocess.CompletedProcess) -> None:
    """Stdout (a pipe) holds JSON events alone; the job says its config once and shows
    nothing of torchrun's own report."""
    for line in job.stdout.splitlines():
        json.loads(line)
    assert job.stderr.count("config: ") == 1, job.stderr
    for mark in ("Traceback", "ChildFailedError", "torch/distributed/elastic"):
        assert mark not in job.stdout + job.stderr, job.stderr


def _events(run_dir: Path, event: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


def _drawn(run_dir: Path, step: int) -> list[str]:
    """The trajectory ids (step, draw, question id, sample) dumped for ``step``."""
    path = run_dir / "trajectories" / f"step_{step:06d}.jsonl"
    return [json.loads(line)["trajectory_id"] for line in path.read_text().splitlines()]


def test_update_of_two_ranks_equals_the_one_process_update(tmp_path: Path) -> None:
    """Fixed datums (no sampling), float64: 2 ranks, each its share, give the one-process
    LoRA weights after two AdamW steps (the second with one datum: one rank has none)."""
    import update_worker  # this folder's; one process: here, without torchrun

    model = build_small_tiny_model(tmp_path / "tiny")
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    update_worker.main(str(model), str(one))
    worker = HERE / "update_worker.py"
    subprocess.run(
        [*TORCHRUN, "2", worker, model, two], check=True, env=_env(tmp_path), timeout=300
    )
    a, b = torch.load(one), torch.load(two)
    assert a.keys() == b.keys() and a
    for name in a:
        assert_same64(b[name], a[name], name)
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # it learned


@pytest.mark.slow
def test_two_ranks_record_once_draw_as_one_process_and_resume_on_one(tmp_path: Path) -> None:
    config = write_config(tmp_path, make_config(RUN))
    two, one = tmp_path / "two", tmp_path / "one"
    done = _train(tmp_path, "--config", config, "--run-dir", two, nproc=2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_piped_output(done)
    metrics = _events(two, "metrics")
    assert [m["step"] for m in metrics] == [1, 2]  # once per step, not once per rank
    for m in metrics:
        assert m["world_size"] == 2
        dumped = two / "trajectories" / f"step_{m['step']:06d}.jsonl"
        assert len(dumped.read_text().splitlines()) == 6  # 3 questions x 2, from both ranks
    assert [c["step"] for c in _events(two, "checkpoint")] == [2]
    assert (two / "ranks" / "rank1.jsonl").is_file()
    # the same run on one process, three steps; the 2-rank run resumed on one process
    assert _train(tmp_path, "--config", config, "--run-dir", one, "--max-steps", 3).returncode == 0
    resumed = _train(tmp_path, "--config", config, "--run-dir", two, "--resume", "--max-steps", 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in _events(two, "metrics")] == [1, 2, 3]
    assert "world_size" not in _events(two, "metrics")[-1]
    for step in (1, 2, 3):  # same questions and sample ids whatever the world size
        assert _drawn(two, step) == _drawn(one, step)
        assert len(_drawn(one, step)) == 6


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of this test's worker process of ``rank`` (from /proc/<pid>/environ)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SEARCHR1_TEST_JOB={marker}".encode() in env and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_with_a_clear_error_and_whole_checkpoints(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, make_config(RUN, train={"max_steps": 500, "save_every": 1}))
    run_dir = tmp_path / "run"
    command = [*TORCHRUN, "2", "-m", "searchr1", "train", "--config", config, "--run-dir", run_dir]
    job = subprocess.Popen(
        list(map(str, command)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(tmp_path),
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "events.jsonl").is_file() or not _events(run_dir, "checkpoint"):
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        pid = _rank_pid(str(tmp_path), 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert "another process of this torchrun job (world size 2) stopped" in out, out[-4000:]
    assert "kept: checkpoint step" in out and "searchr1 train --resume" in out
    folder = run_dir / "checkpoints"
    assert all(p.name.startswith("step_") for p in folder.iterdir())  # no half-written one
    for checkpoint in list_checkpoints(run_dir):
        read_checkpoint(checkpoint.path)


def test_a_config_error_under_nproc_exits_2_with_one_message(tmp_path: Path) -> None:
    """Every rank refuses the config; the job says why once and exits 2, as one process."""
    config = write_config(tmp_path, make_config(RUN, train={"max_staleness": 1}))
    job = _train(tmp_path, "--config", config, "--run-dir", tmp_path / "run", nproc=2)
    assert job.returncode == 2, job.stderr[-3000:]
    message = "searchr1: error: train.max_staleness = 1: pipelined rollouts are not supported"
    assert job.stderr.count(message) == 1, job.stderr
    _assert_piped_output(job)


@pytest.mark.slow
def test_ctrl_c_under_nproc_exits_130_and_says_how_to_resume(tmp_path: Path) -> None:
    """SIGINT to ``searchr1 train --nproc 2`` (what Ctrl-C sends it; the ranks run in their
    own sessions) stops every rank after a step: exit 130, rank 0's resume line once."""
    config = write_config(tmp_path, make_config(RUN, train={"max_steps": 500, "save_every": 500}))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "searchr1", "train", "--config", config, "--run-dir", run_dir]
    job = subprocess.Popen(
        [*map(str, command), "--nproc", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "events.jsonl").is_file() or not _events(run_dir, "metrics"):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.5)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    done = subprocess.CompletedProcess(job.args, job.returncode, out, err)
    assert job.returncode == 130, err[-3000:]
    assert err.count("searchr1: stopped by SIGINT during RL step") == 1, err
    assert err.count("stopping at the end of this unit of work") == 1, err  # rank 0's note
    assert f"searchr1 train --resume --run-dir {run_dir}" in err
    assert "SignalException" not in err
    _assert_piped_output(done)


def test_two_ranks_pass_the_evals_and_the_cold_start_phases_together(tmp_path: Path) -> None:
    """Rank 0 alone evaluates (before, after the cold start, each step's periodic eval with its
    best checkpoint, after the last); every rank passes each phase at the same point, so the
    job ends as one process's would, with no eval started on the other rank."""
    heldout = tmp_path / "heldout.jsonl"
    rows = [{"question": f"who founded city {n}?", "answers": [f"founder {n}"]} for n in range(4)]
    heldout.write_text("".join(json.dumps(row) + "\n" for row in rows))
    evals = {"eval_before_after": True, "eval_every": 1, "keep_best": True}
    cold_start = {"cold_start": {"steps": 1, "questions_per_step": 2}}
    config = write_config(
        tmp_path, make_config(RUN, train={**evals, **cold_start}, data={"eval": str(heldout)})
    )
    run_dir = tmp_path / "run"
    done = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "never awaited" not in done.stderr, done.stderr[-3000:]
    whens = [e["when"] for e in _events(run_dir, "eval/heldout_em")]
    assert whens == ["before", "cold_start", "step_0", "step_1", "step_2", "after"]
    assert len(_events(run_dir, "cold_start_done")) == 1
    assert [m["step"] for m in _events(run_dir, "metrics")] == [1, 2]
    assert (run_dir / "checkpoints" / "best").is_dir()
