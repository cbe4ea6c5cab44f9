"""``searchr1 smoke`` and a one-step ``searchr1 train`` on a tiny random Qwen3.5 (Gated
DeltaNet hybrid) with ``target_modules = "all-linear"``, through the CLI; and smoke's
diagnosis when the model itself fails (it names the exception and ``base_model``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from arch_models import build_family
from cli_run import make_config, read_events
from numerics import LOGPROB_TOL_F32

from searchr1.core.step_metrics import logprob_diff_max


def _run(tmp_path: Path, model: Path | str) -> dict[str, dict[str, Any]]:
    """One training step of ``model`` with an all-linear adapter, runs under ``tmp_path``."""
    return {
        "run": {"dir": str(tmp_path / "runs")},
        "model": {"base_model": str(model), "temperature": 1.0, "top_p": 1.0},
        "lora": {"target_modules": "all-linear"},
        "train": {"max_steps": 1, "save_every": 1, "max_micro_batch_tokens": 2048},
    }


def _config(config_file, tmp_path: Path, model: Path | str) -> Path:  # noqa: ANN001
    return config_file(make_config(_run(tmp_path, model)))


def test_smoke_and_one_train_step_on_tiny_qwen3_5(tmp_path: Path, config_file, run_cli) -> None:  # noqa: ANN001
    _smoke_and_train("qwen3_5", tmp_path, config_file, run_cli)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", ["qwen3_next", "mistral_sliding", "gemma3_mixed", "qwen3_moe", "llama"]
)
def test_smoke_and_one_train_step_on_other_families(
    tmp_path: Path,
    config_file,  # noqa: ANN001
    run_cli,  # noqa: ANN001
    family: str,
) -> None:
    _smoke_and_train(family, tmp_path, config_file, run_cli)


def _smoke_and_train(family: str, tmp_path: Path, config_file, run_cli) -> None:  # noqa: ANN001
    model = build_family(family, tmp_path / family)
    config = _config(config_file, tmp_path, model)
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    out = smoke.err  # smoke's report (stdout: JSON events)
    assert "model channel failed" not in out and "could not start" not in out, out
    assert "trajectory 0:" in out and "trajectory 1:" in out, out
    # 3: the channels work but a random model shows none of the reference setup's behaviour
    assert smoke.code in (0, 3), out

    run = tmp_path / "train"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    metrics = read_events(run, "metrics")
    assert metrics and metrics[-1]["step"] == 1
    adapter = json.loads(next(run.rglob("adapter_config.json")).read_text())
    targets = {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]}
    assert {"q_proj", "o_proj"} <= targets, targets  # all-linear: attention ...
    if family not in ("qwen3_moe", "qwen3_next"):  # (fused experts are not nn.Linear)
        assert "down_proj" in targets, targets  # ... the MLP ...
    if family in ("qwen3_5", "qwen3_next"):
        assert targets & {"in_proj_qkv", "in_proj_qkvz"}, targets  # ... and Gated DeltaNet


def test_smoke_names_projections_that_do_not_exist(tmp_path: Path, config_file, run_cli) -> None:  # noqa: ANN001
    model = build_family("llama", tmp_path / "llama")
    config = config_file(
        make_config(_run(tmp_path, model), lora={"target_modules": ["in_proj_qkv", "q_proj"]})
    )
    # a config error (exit 2, with the line), found on the meta-device model before any load
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    assert smoke.code == 2, smoke.out + smoke.err
    (error,) = [line for line in smoke.err.splitlines() if "in_proj_qkv" in line]
    assert error.startswith(f"searchr1: error: {config}:") and str(model) in error
    assert 'target_modules = "all-linear"' in error


def test_smoke_names_a_model_side_failure_and_the_base_model(
    tmp_path: Path,
    config_file,  # noqa: ANN001
    run_cli,  # noqa: ANN001
) -> None:
    model = build_family("llama", tmp_path / "broken")
    cfg = json.loads((model / "config.json").read_text())
    cfg["model_type"] = "qwen_nonexistent"
    (model / "config.json").write_text(json.dumps(cfg))
    config = _config(config_file, tmp_path, model)
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    out = smoke.err
    assert smoke.code == 1
    diagnosis = next(line for line in out.splitlines() if line.startswith("diagnosis:"))
    assert str(model) in diagnosis
    assert "qwen_nonexistent" in diagnosis and "Error" in diagnosis
    assert "pip install -U transformers" in diagnosis


def test_pipelined_steps_train_on_tiny_qwen3_5(
    tmp_path: Path,
    monkeypatch,  # noqa: ANN001
    config_file,  # noqa: ANN001
    run_cli,  # noqa: ANN001
) -> None:
    """``max_staleness = 1`` on the hybrid architecture: the sampler's pinned LoRA copy covers
    every all-linear target (Gated DeltaNet projections included) and steps 2 and 3 learn
    from samples one version old (a reward that varies per trajectory, so groups train)."""
    from remote_cli import ChecksumRewardPlugin

    from searchr1.core.plugins import load_registry

    registry = load_registry([ChecksumRewardPlugin()])
    model = build_family("qwen3_5", tmp_path / "qwen3_5")
    config = config_file(
        make_config(
            _run(tmp_path, model),
            train={"max_steps": 3, "save_every": 3, "max_staleness": 1},
            rollout={"group_size": 4},
            reward={"name": "token_checksum"},
        )
    )
    run = tmp_path / "train"
    assert run_cli("train", "--config", config, "--run-dir", run, registry=registry).code == 0
    metrics = read_events(run, "metrics")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["staleness/max"] for m in metrics] == [0.0, 1.0, 1.0]
    trained = [m for m in metrics if m["tokens/trained"] > 0]  # (a tied group trains nothing)
    fresh = [m for m in trained if m["staleness/max"] == 0]
    stale = [m for m in trained if m["staleness/max"] == 1]
    assert fresh and stale, [(m["step"], m["tokens/trained"]) for m in metrics]
    # samples learned on the weights they came from are on-policy; stale ones differ by the
    # update since (corrected by the ratio): so the pinned copy really lagged the learner
    assert all(logprob_diff_max(m) < LOGPROB_TOL_F32 for m in fresh)
    assert all(logprob_diff_max(m) > LOGPROB_TOL_F32 for m in stale)
