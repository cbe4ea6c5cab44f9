"""Checkpoints damaged after they were saved, and the litter of a save that was killed.

One real run of the tiny model (two steps, a checkpoint after each) is trained once for the
module; each test damages a copy of it: a truncated ``adapter_model.safetensors`` or
``optimizer.pt``, as a full disk or a copy cut short leaves them. The killed save is a real
process SIGKILLed inside ``save_checkpoint`` (its model state writer waits there, so the kill
lands while the hidden folder exists). The run's rollout (768 tokens) does not fit the
embedded demo's ``[train] max_datum_tokens`` (448), so evaluating it without ``--config``
must use the checkpoint's own ``[train]`` as well.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import make_config, read_events, write_config

from searchr1.core.checkpoint import remove_stale_saves

ADAPTER = "model/adapter/adapter_model.safetensors"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step run (``checkpoints/step_000001``, ``step_000002``) and its config
    beside it (``train.toml``)."""
    from searchr1.cli.main import main

    home = tmp_path_factory.mktemp("trained")
    config = write_config(
        home,
        make_config(
            rollout={"max_trajectory_tokens": 768},
            train={
                "save_every": 1,
                "max_datum_tokens": 768,
                "max_micro_batch_datums": 4,
                "max_micro_batch_tokens": 1024,
                "dump_trajectories": 0,
            },
        ),
        "train.toml",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)
        mp.delenv("SEARCHR1_CONFIG", raising=False)
        assert main(["train", "--config", str(config), "--run-dir", str(home / "run")]) == 0
    return home / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _no_traceback(*texts: str) -> None:
    assert not any("Traceback" in text for text in texts)


#: a save that stops inside the model's state writer, after writing part of it
_STALLED_SAVE = """
import sys, time
from pathlib import Path
from searchr1.core.checkpoint import save_checkpoint
from searchr1.core.config import load_config
from searchr1.core.plugins import load_registry

class Stalls:
    def save_state(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x" * 4096)
        print("saving", flush=True)
        time.sleep(300)

save_checkpoint(Path(sys.argv[1]), 3, Stalls(), load_config(sys.argv[2], registry=load_registry()), {})
"""


@pytest.mark.slow  # the module's tiny run, a saving process killed, then a resumed step (~15-30 s)
def test_resume_passes_a_truncated_adapter_and_removes_a_killed_saves_folder(
    trained: Path, tmp_path: Path, run_cli
) -> None:
    run = _copy(trained, tmp_path)
    config = trained.parent / "train.toml"
    adapter = run / "checkpoints" / "step_000002" / ADAPTER
    _truncate(adapter)

    saver = subprocess.Popen(
        [sys.executable, "-c", _STALLED_SAVE, str(run), str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert saver.stdout is not None and saver.stdout.readline() == "saving\n"
        (hidden,) = (run / "checkpoints").glob(".step_000003-*")
        # while that save runs, a start leaves its folder alone
        assert remove_stale_saves(run) == [] and hidden.is_dir()
    finally:
        saver.kill()
        saver.wait()
    assert hidden.is_dir()  # what the killed save left

    result = run_cli("train", "--config", config, "--run-dir", run, "--resume")
    assert result.code == 0, result.err
    _no_traceback(result.out, result.err)
    assert f"{adapter} is truncated" in result.err
    assert "resuming from the previous good checkpoint" in result.err
    assert str(run / "checkpoints" / "step_000001") in result.err
    assert not hidden.exists()
    assert any(e["path"] == str(hidden) for e in read_events(run, "stale_save_removed"))
    assert [e["step"] for e in read_events(run, "resumed")] == [1]
    # step 2 trained again and saved whole
    saved = json.loads((run / "checkpoints" / "step_000002" / "trainer.json").read_text())
    assert saved["files"][ADAPTER] == adapter.stat().st_size


@pytest.mark.parametrize(
    "damaged, sizes_recorded, given",
    [
        (ADAPTER, True, ""),
        (ADAPTER, False, ""),
        ("model/optimizer.pt", False, ""),
        (ADAPTER, False, "model"),
    ],
    ids=["adapter", "adapter-older-checkpoint", "optimizer-older-checkpoint", "model-folder"],
)
def test_eval_of_a_damaged_checkpoint_names_the_file_and_the_usable_ones(
    trained: Path, tmp_path: Path, run_cli, damaged: str, sizes_recorded: bool, given: str
) -> None:
    """Refused before any model is loaded; without recorded sizes (a checkpoint saved before
    they were kept, or its model state folder given alone) the file's own header shows the
    truncation."""
    run = _copy(trained, tmp_path)
    folder = run / "checkpoints" / "step_000002"
    if not sizes_recorded:
        meta = json.loads((folder / "trainer.json").read_text())
        del meta["files"]
        (folder / "trainer.json").write_text(json.dumps(meta))
    _truncate(folder / damaged)
    target = folder / given if given else folder
    result = run_cli("eval", "--checkpoint", target, "--data", "builtin:world/train.jsonl")
    assert result.code == 2
    _no_traceback(result.out, result.err)
    assert f"{folder / damaged} is truncated" in result.err
    if not given:
        assert f"usable checkpoints: {run / 'checkpoints' / 'step_000001'}" in result.err


def test_eval_without_config_uses_the_checkpoints_whole_config(
    trained: Path, tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --config and no ./config.toml: the embedded demo is the default, whose [train]
    the checkpoint's rollout does not fit. The run's newest checkpoint is damaged, so its
    newest usable one is evaluated, with a warning."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    run = _copy(trained, tmp_path)
    _truncate(run / "checkpoints" / "step_000002" / ADAPTER)
    data = tmp_path / "other.jsonl"
    data.write_text(json.dumps({"id": "q", "question": "Who founded Velmora?", "answers": ["x"]}))
    result = run_cli("eval", "--checkpoint", run, "--data", data, "--run-dir", tmp_path / "e")
    assert result.code == 0, result.err
    _no_traceback(result.out, result.err)
    assert "<embedded offline default>" in result.out
    assert (
        f"eval: the settings the checkpoint was trained with, from "
        f"{run / 'checkpoints' / 'step_000001' / 'config.toml'}" in result.err
    )
    assert f"{run / 'checkpoints' / 'step_000002' / ADAPTER} is truncated" in result.err
    assert (tmp_path / "e" / "eval_step_1.jsonl").is_file()


def test_run_colon_name_lists_the_valid_names(trained: Path, run_cli) -> None:
    result = run_cli("eval", "--checkpoint", f"{trained}:worst", "--data", "x.jsonl")
    assert result.code == 2
    _no_traceback(result.out, result.err)
    assert f"{trained} has no checkpoint named 'worst'" in result.err
    assert "takes best only" in result.err
    for step in ("step_000001", "step_000002"):
        assert str(trained / "checkpoints" / step) in result.err
