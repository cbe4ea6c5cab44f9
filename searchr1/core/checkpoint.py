"""Atomic training checkpoints under ``runs/<run>/checkpoints/step_NNNNNN/``.

The train loop calls :func:`save_checkpoint` every ``train.save_every`` steps, at the end and
on SIGINT/SIGTERM, and :func:`latest_checkpoint` on ``--resume``. A checkpoint holds the
model provider's state (adapter, optimizer, step: ``model/``), the loop's state
(``trainer.json``: step, data cursor, Python RNG), torch's RNG state (``rng.pt``) and the
resolved config with secrets redacted (``config.toml``).

Atomicity: everything is written into a hidden temporary folder which is renamed into place
only once complete, so a crash (SIGKILL included) mid-write never leaves a broken
checkpoint; only complete ``step_*`` folders are ever considered.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from searchr1.core.config import Config
from searchr1.core.types import ModelProvider

KEEP = 3


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(
    run_dir: Path, step: int, model: ModelProvider, config: Config, state: dict[str, Any]
) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the newest ``KEEP``."""
    import torch

    parent = checkpoints_dir(run_dir)
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=parent))
    try:
        model.save_state(str(tmp / "model"))
        trainer_state = {"step": step, "python_rng": _encode_rng(random.getstate()), **state}
        (tmp / "trainer.json").write_text(json.dumps(trainer_state, indent=1))
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / "config.toml").write_text(tomli_w.dumps(_toml_safe(config.to_dict(redact=True))))
        _fsync_tree(tmp)
        if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-KEEP]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Complete checkpoints, oldest first."""
    out = []
    for path in sorted(checkpoints_dir(run_dir).glob("step_*")):
        meta = path / "trainer.json"
        if not meta.is_file():
            continue
        state = json.loads(meta.read_text())
        out.append(Checkpoint(path=path, step=int(state["step"]), state=state))
    return sorted(out, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def restore_rng(checkpoint: Checkpoint) -> None:
    """Put Python's and torch's global RNGs back where they were at save time."""
    import torch

    random.setstate(_decode_rng(checkpoint.state["python_rng"]))
    rng = torch.load(checkpoint.path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _toml_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _toml_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_toml_safe(v) for v in value]
    return value


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
