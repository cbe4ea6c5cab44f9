"""A ``[model] base_model`` hub id when the Hugging Face hub cannot be reached (the hub's address
is a loopback port nothing listens on, the cache a fresh ``HF_HOME``): a model that is not
cached fails at once with why (no huggingface_hub retry loop), a cached one trains from the
cache. Each run is a real ``searchr1 train`` process, since huggingface_hub reads ``HF_HOME``
and ``HF_ENDPOINT`` when it is imported."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cli_run import make_config, read_events, write_config

from searchr1.core.assets import resolve
from searchr1.core.plugins import load_registry


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(tmp_path: Path, base_model: str) -> subprocess.CompletedProcess[str]:
    config = write_config(
        tmp_path,
        make_config(model={"base_model": base_model}, train={"max_steps": 1, "save_every": 1}),
    )
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        # a mirror's address with credentials in it, which no message may show
        "HF_ENDPOINT": f"http://mirror-user:hf-secret-token@127.0.0.1:{_closed_port()}",
        "HF_HUB_OFFLINE": "0",
    }
    argv = ["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    return subprocess.run(
        [sys.executable, "-m", "searchr1.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_hub_model_not_in_the_cache_fails_at_once_saying_why(tmp_path: Path) -> None:
    result = _train(tmp_path, "acme/not-cached")
    assert result.returncode == 2, result.stderr
    assert "model.base_model = 'acme/not-cached': cannot load a tokenizer" in result.stderr
    assert "no folder of that name is here, it is not in this machine's Hugging Face cache" in (
        result.stderr
    )
    assert "cannot be reached: connection refused" in result.stderr
    assert "hf download acme/not-cached" in result.stderr
    assert "Retrying" not in result.stderr  # huggingface_hub's own retries never started
    assert "hf-secret-token" not in result.stderr + result.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_cached_hub_model_trains_from_the_cache(tmp_path: Path) -> None:
    # The hub cache's own layout: models--ORG--NAME/{refs/main, snapshots/COMMIT/...}
    folder = Path(resolve("builtin:tiny", load_registry().assets))
    repo = tmp_path / "hf" / "hub" / "models--acme--tiny"
    commit = "0" * 40
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    result = _train(tmp_path, "acme/tiny")
    assert result.returncode == 0, result.stderr
    assert "Retrying" not in result.stderr, result.stderr  # not at load, nor at the save
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()
    (warning,) = read_events(tmp_path / "run", "hub_unreachable")
    assert "connection refused" in warning["why"] and "cache alone" in warning["using"]
    assert "hf-secret-token" not in (tmp_path / "run" / "events.jsonl").read_text()
