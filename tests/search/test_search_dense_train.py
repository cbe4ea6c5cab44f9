"""The offline demo on dense retrieval: ``searchr1 smoke`` and two training steps with
``[search] provider = "dense"`` on the index ``searchr1 index build`` made of the world's
corpus, and training with ``provider = "search_r1"`` against ``searchr1 serve-retriever``
serving that index on loopback (a real server process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import make_config, read_events

# each test trains the tiny model for two steps (~20-40 s on 2 cores)
pytestmark = pytest.mark.slow

#: the run both tests train, on the search provider each test adds
RUN = {
    "model": {"max_new_tokens": 24},
    "lora": {"dropout": None},
    "rollout": {
        "questions_per_batch": 2,
        "group_size": 3,
        "max_search_calls": 2,
        "max_assistant_turns": 3,
        "max_trajectory_tokens": 448,
        "max_observation_tokens": 96,
        "dynamic_sampling": False,
    },
    "search": {"top_k": 2, "local": None},
    "train": {"eval_before_after": False, "max_micro_batch_tokens": 2048},
    "smoke": {
        "question": "Who founded Nungen Guild?",
        "answers": ["Vazil Nesfir"],
        "report_only": ["both_signs", "searches_in_range"],
    },
}


@pytest.fixture(scope="module")
def world_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from searchr1.cli.main import main

    out = tmp_path_factory.mktemp("world") / "index"
    assert main(["index", "build", "builtin:world/corpus.jsonl", "--out", str(out)]) == 0
    return out


def _searches(run: Path) -> tuple[float, float]:
    """Search calls and success rate summed over the run's step metrics."""
    metrics = read_events(run, "metrics")
    assert [m["step"] for m in metrics] == [1, 2]
    calls = sum(m["search/calls"] for m in metrics)
    return calls, min(m["search/success_rate"] for m in metrics if m["search/calls"])


def test_the_offline_demo_trains_on_the_dense_provider(
    tmp_path: Path, world_index: Path, config_file, run_cli
) -> None:  # noqa: ANN001
    dense = {"provider": "dense", "dense": {"index": str(world_index)}}
    config = config_file(make_config(RUN, search=dense))
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    assert smoke.code == 0, smoke.out + smoke.err
    assert "search probe: ok (2 results)" in smoke.err
    assert "search success rate: 100.00%" in smoke.err
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    calls, success = _searches(tmp_path / "run")
    assert calls > 0 and success == 1.0


def test_search_r1_provider_trains_against_serve_retriever(
    tmp_path: Path, world_index: Path, config_file, run_cli
) -> None:  # noqa: ANN001
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "searchr1.cli",
            "serve-retriever",
            "--index",
            str(world_index),
            "--port",
            "0",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = []
        for line in server.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("listening on "):
                break
        assert lines and lines[-1].startswith("listening on http://127.0.0.1:"), lines
        base = lines[-1].split()[-1].removesuffix("/retrieve")
        search = {"provider": "search_r1", "api_base": base}
        config = config_file(make_config(RUN, search=search))
        result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
        assert result.code == 0, result.err
        calls, success = _searches(tmp_path / "run")
        assert calls > 0 and success == 1.0
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert server.returncode == 143, out  # 128 + SIGTERM, as documented
    served = int(out.split("stopped by SIGTERM after ")[1].split()[0])
    assert 0 < served <= calls  # the client batched concurrent queries into fewer requests
