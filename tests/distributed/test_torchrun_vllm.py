"""``searchr1 train --nproc 2`` (gloo on CPU) with ``model.provider = "vllm"`` on two fake vLLM
servers (``tests/helpers/fake_vllm.py``, real HTTP on loopback) on the demo: each rank samples
its share of a step from both servers, rank 0 alone loads every adapter version into every
server before any rank samples it, rank 0 writes one metrics event a step with ``world_size``
2, and the update is one process's on the same trajectories (float64). A server that dies
during step 2 stops the job with an error naming it, the step-1 checkpoint intact, and
``--resume`` continues (the adapter loaded from the checkpoint reaches every server before
either rank samples it).

Rank 0 can also launch the servers (``[model.vllm] python``; here a script that runs the fake
server on the command line's port): the other ranks reach them at the addresses it tells them,
and no server inherits the torchrun job's variables.

The servers answer as a scripted policy (``fake_vllm.scripted_policy``): the first sample of
a group plays the offline world's ideal agent, the second answers ``unknown``, so the groups'
rewards differ and the step has a gradient.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from cli_run import make_config, write_config
from fake_vllm import FakeVllm, fake_vllm_servers, scripted_policy
from numerics import assert_same64

from searchr1.core.checkpoint import list_checkpoints

RUN: dict[str, dict[str, Any]] = {
    "model": {
        "provider": "vllm",
        "dtype": "float64",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 48,
    },
    "rollout": {"questions_per_batch": 3, "group_size": 2, "dynamic_sampling": False},
    "train": {"max_steps": 2, "save_every": 1, "dump_trajectories": 64},
    "optimizer": {"lr": 5e-3},
}


def _servers(
    policy: Callable[[list[int], int], list[int]], ports: tuple[int, ...] = (0, 0)
) -> AbstractContextManager[list[FakeVllm]]:
    """Fake servers answering with ``policy`` (``sample_for``)."""
    return fake_vllm_servers(
        len(ports), ports, sample_for=policy, finish_reason="stop", max_model_len=1024
    )


def _train(
    tmp_path: Path, *args: str | Path, nproc: int = 1, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    own = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env = {**own, **(env or {})}
    command = [sys.executable, "-m", "searchr1", "train", *map(str, args)]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},  # one thread a process (2 cores here)
        timeout=600,
        check=False,
    )


def _config(tmp_path: Path, servers: list[FakeVllm], name: str) -> Path:
    vllm = {"api_bases": [s.url for s in servers], "adapters_dir": str(tmp_path / name)}
    return write_config(tmp_path, make_config(RUN, model={"vllm": vllm}), f"{name}.toml")


def _events(run_dir: Path, event: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


def _adapter(run_dir: Path, step: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    folder = run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "adapter"
    return load_file(str(folder / "adapter_model.safetensors"))


def _trajectories(run_dir: Path, step: int) -> list[tuple[str, float]]:
    path = run_dir / "trajectories" / f"step_{step:06d}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted((r["trajectory_id"], r["reward"]) for r in rows)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[int], int], list[int]]:
    folder = tmp_path_factory.mktemp("policy")
    return scripted_policy(write_config(folder, make_config(RUN)))


def test_two_ranks_on_two_servers_train_as_one_process(
    tmp_path: Path, policy: Callable[[list[int], int], list[int]]
) -> None:
    two, one = tmp_path / "two", tmp_path / "one"
    with _servers(policy) as servers:
        job = _train(
            tmp_path, "--config", _config(tmp_path, servers, "a2"), "--run-dir", two, nproc=2
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        loads = [list(s.loads) for s in servers]
        served = [{c.model for c in s.completions} for s in servers]
    metrics = _events(two, "metrics")
    assert [m["step"] for m in metrics] == [1, 2]  # once a step, not once a rank
    assert all(m["world_size"] == 2 for m in metrics)
    # every version (the connect's, then one a step) loaded once into every server, by rank 0
    assert len(loads[0]) == 3 and loads[0] == loads[1], loads
    assert all(served[k] and served[k] <= set(loads[k]) for k in range(2))  # both sampled
    assert len(_trajectories(two, 1)) == 6  # 3 questions x 2, from both ranks
    assert (two / "ranks" / "rank1.jsonl").is_file()

    with _servers(policy) as servers:
        job = _train(tmp_path, "--config", _config(tmp_path, servers, "a1"), "--run-dir", one)
        assert job.returncode == 0, job.stderr[-3000:]
    for step in (1, 2):
        assert _trajectories(two, step) == _trajectories(one, step)
    rewards = {reward for _, reward in _trajectories(one, 1)}
    assert len(rewards) > 1  # the groups' rewards differ: the step has a gradient
    a, b = _adapter(one, 2), _adapter(two, 2)
    assert a.keys() == b.keys() and a
    for name in a:
        assert_same64(b[name], a[name], name)
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # it learned


def test_a_server_that_dies_is_named_and_the_run_resumes(
    tmp_path: Path, policy: Callable[[list[int], int], list[int]]
) -> None:
    run_dir = tmp_path / "run"
    with _servers(policy) as servers:
        config = _config(tmp_path, servers, "adapters")
        servers[1].die_after_loads = 2  # version 0, then step 1's: dies in step 2's rollout
        job = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2)
        ports = tuple(int(s.url.rpartition(":")[2]) for s in servers)
    assert job.returncode == 3, job.stderr[-3000:]  # the server's side (core/errors.py)
    assert f"vLLM server1 at {servers[1].url}" in job.stderr, job.stderr[-3000:]
    assert "Traceback" not in job.stderr
    assert [c.step for c in list_checkpoints(run_dir)] == [1]
    assert [m["step"] for m in _events(run_dir, "metrics")] == [1]

    with _servers(policy, ports) as servers:  # the server is back where it was
        resumed = _train(tmp_path, "--config", config, "--run-dir", run_dir, "--resume", nproc=2)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        loads = [list(s.loads) for s in servers]
    assert [m["step"] for m in _events(run_dir, "metrics")] == [1, 2]
    # the connect's version, the checkpoint's (published at once by rank 0), step 2's
    assert len(loads[0]) == 3 and loads[0] == loads[1], loads
    assert [c.step for c in list_checkpoints(run_dir)] == [1, 2]


def _launched_config(tmp_path: Path) -> Path:
    """Two servers rank 0 launches: the fake server, run by a ``python`` of its own."""
    helpers = Path(__file__).resolve().parents[1] / "helpers"
    root = Path(__file__).resolve().parents[2]
    python = tmp_path / "vllm-python"  # the launched server's PYTHONPATH is cleared: set here
    python.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={root}:{helpers}\n"
        f'exec {sys.executable} {helpers / "fake_vllm.py"} "$@"\n'
    )
    python.chmod(0o755)
    vllm = {"python": str(python), "servers": 2, "startup_timeout_s": 120}
    return write_config(tmp_path, make_config(RUN, model={"vllm": vllm}))


@pytest.mark.slow  # ~30 s: the two launched servers start as processes of their own
def test_rank_0_launches_the_servers_for_the_whole_job(tmp_path: Path) -> None:
    config = _launched_config(tmp_path)
    record = tmp_path / "record"
    record.mkdir()
    env = {"FAKE_VLLM_POLICY": str(config), "FAKE_VLLM_RECORD": str(record)}
    job = _train(tmp_path, "--config", config, "--run-dir", tmp_path / "run", nproc=2, env=env)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    metrics = _events(tmp_path / "run", "metrics")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["world_size"] == 2 for m in metrics)
    assert len(_trajectories(tmp_path / "run", 1)) == 6
    loads = sorted(p.read_text().splitlines() for p in record.glob("*.loads"))
    assert len(loads) == 2 and len(loads[0]) == 3 and loads[0] == loads[1], loads  # two servers
    for seen in record.glob("*.env"):  # none of the job's variables reached a server
        names = set(seen.read_text().split())
        assert not names & {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}


@pytest.mark.slow  # ~30 s, as above
def test_a_launched_server_that_dies_is_named_as_dead_on_every_rank(tmp_path: Path) -> None:
    """Killed in step 2 (the kernel's OOM killer, say): whichever rank reports first, the job
    says the server rank 0 launched has ended, never "is the server running? fix the port"."""
    config = _launched_config(tmp_path)
    # TMPDIR: where the provider keeps a dead server's log (the error names it)
    env = {
        "FAKE_VLLM_POLICY": str(config),
        "FAKE_VLLM_DIE_AFTER_LOADS": "2",
        "TMPDIR": str(tmp_path),
    }
    run_dir = tmp_path / "run"
    job = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2, env=env)
    assert job.returncode == 3, job.stderr[-3000:]
    assert "Traceback" not in job.stderr and "fix the port" not in job.stderr, job.stderr[-3000:]
    rank0 = ", which this run launched (pid "
    other = "which rank 0 of this torchrun job launched, failed during POST /v1/completions"
    assert rank0 in job.stderr or other in job.stderr, job.stderr[-3000:]
    if rank0 in job.stderr:
        assert "was killed by SIGKILL" in job.stderr
        # a dead server's log is kept (both may have died: each had its completions)
        kept = sorted(tmp_path.glob("searchr1-vllm-*.log"))
        assert kept and any(f"its log: {log}" in job.stderr for log in kept), job.stderr
    assert [c.step for c in list_checkpoints(run_dir)] == [1]
