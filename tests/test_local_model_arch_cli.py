"""``searchr1 smoke`` and a one-step ``searchr1 train`` on a tiny random Qwen3.5 (Gated
DeltaNet hybrid) with ``target_modules = "all-linear"``, through the CLI; and smoke's
diagnosis when the model itself fails (it names the exception and ``base_model``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from arch_models import build_family

from searchr1.core.cli import main as cli

CONFIG = """
[run]
seed = 1
dir = "{runs}"
[model]
provider = "local"
base_model = "{model}"
temperature = 1.0
top_p = 1.0
max_new_tokens = 16
[lora]
rank = 4
alpha = 8
dropout = 0.0
target_modules = "all-linear"
[rollout]
protocol = "tags"
questions_per_batch = 1
group_size = 2
max_search_calls = 1
max_assistant_turns = 2
max_trajectory_tokens = 384
max_observation_tokens = 64
[search]
provider = "local"
top_k = 1
[search.local]
corpus = "builtin:world/corpus.jsonl"
[train]
max_steps = 1
save_every = 1
max_datum_tokens = 512
max_micro_batch_tokens = 2048
[data]
train = "builtin:world/train.jsonl"
"""


def _config(tmp_path: Path, model: Path | str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(runs=tmp_path / "runs", model=model), encoding="utf-8")
    return path


def test_smoke_and_one_train_step_on_tiny_qwen3_5(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    _smoke_and_train("qwen3_5", tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", ["qwen3_next", "mistral_sliding", "gemma3_mixed", "qwen3_moe", "llama"]
)
def test_smoke_and_one_train_step_on_other_families(tmp_path: Path, capsys, family: str) -> None:  # noqa: ANN001
    _smoke_and_train(family, tmp_path, capsys)


def _smoke_and_train(family: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    model = build_family(family, tmp_path / family)
    config = _config(tmp_path, model)
    code = cli(["smoke", "--config", str(config), "--run-dir", str(tmp_path / "smoke")])
    out = capsys.readouterr().out
    assert "model channel failed" not in out and "could not start" not in out, out
    assert "trajectory 0:" in out and "trajectory 1:" in out, out
    # 3: the channels work but a random model shows none of the seed's behaviour (smoke_verdict)
    assert code in (0, 3), out

    run = tmp_path / "train"
    assert cli(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if x]
    metrics = [e for e in events if e["event"] == "metrics"]
    assert metrics and metrics[-1]["step"] == 1
    adapter = json.loads(next(run.rglob("adapter_config.json")).read_text())
    targets = {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]}
    assert {"q_proj", "o_proj"} <= targets, targets  # all-linear: attention ...
    if family not in ("qwen3_moe", "qwen3_next"):  # (fused experts are not nn.Linear)
        assert "down_proj" in targets, targets  # ... the MLP ...
    if family in ("qwen3_5", "qwen3_next"):
        assert targets & {"in_proj_qkv", "in_proj_qkvz"}, targets  # ... and Gated DeltaNet


def test_smoke_names_projections_that_do_not_exist(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    model = build_family("llama", tmp_path / "llama")
    config = _config(tmp_path, model)
    text = config.read_text().replace('"all-linear"', '["in_proj_qkv", "q_proj"]')
    config.write_text(text)
    code = cli(["smoke", "--config", str(config), "--run-dir", str(tmp_path / "smoke")])
    out = capsys.readouterr().out
    assert code == 1
    diagnosis = next(line for line in out.splitlines() if line.startswith("diagnosis:"))
    assert "in_proj_qkv" in diagnosis and str(model) in diagnosis
    assert 'target_modules = "all-linear"' in diagnosis


def test_smoke_names_a_model_side_failure_and_the_base_model(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    model = build_family("llama", tmp_path / "broken")
    cfg = json.loads((model / "config.json").read_text())
    cfg["model_type"] = "qwen_nonexistent"
    (model / "config.json").write_text(json.dumps(cfg))
    config = _config(tmp_path, model)
    code = cli(["smoke", "--config", str(config), "--run-dir", str(tmp_path / "smoke")])
    out = capsys.readouterr().out
    assert code == 1
    diagnosis = next(line for line in out.splitlines() if line.startswith("diagnosis:"))
    assert str(model) in diagnosis
    assert "qwen_nonexistent" in diagnosis and "Error" in diagnosis
    assert "pip install -U transformers" in diagnosis
