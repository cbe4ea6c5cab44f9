"""A ``[model] base_model`` hub id when the Hugging Face hub cannot be reached (the hub's address
is a loopback port nothing listens on, the cache a fresh ``HF_HOME``): a model that is not
cached fails at once with why (no huggingface_hub retry loop), a cached one trains from the
cache. Each run is a real ``searchr1 train`` process, since huggingface_hub reads ``HF_HOME``
and ``HF_ENDPOINT`` when it is imported."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from cli_run import make_config, read_events, write_config
from offline import hub_cache_folder, hub_out_of_reach, run_searchr1

from searchr1.core.assets import resolve
from searchr1.core.plugins import load_registry


def _train(tmp_path: Path, base_model: str) -> subprocess.CompletedProcess[str]:
    config = write_config(
        tmp_path,
        make_config(model={"base_model": base_model}, train={"max_steps": 1, "save_every": 1}),
    )
    # a mirror's address with credentials in it, which no message may show
    env = hub_out_of_reach(tmp_path / "hf", credentials="mirror-user:hf-secret-token")
    return run_searchr1("train", "--config", config, "--run-dir", tmp_path / "run", env=env)


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
    folder = Path(resolve("builtin:tiny", load_registry().assets))
    shutil.copytree(folder, hub_cache_folder(tmp_path / "hf", "acme/tiny"))
    result = _train(tmp_path, "acme/tiny")
    assert result.returncode == 0, result.stderr
    assert "Retrying" not in result.stderr, result.stderr  # not at load, nor at the save
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()
    (warning,) = read_events(tmp_path / "run", "hub_unreachable")
    assert "connection refused" in warning["why"] and "cache alone" in warning["using"]
    assert "hf-secret-token" not in (tmp_path / "run" / "events.jsonl").read_text()
