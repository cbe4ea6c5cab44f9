"""``searchr1 train --resume``: pick the checkpoint to continue from and check it fits the run.

The train loop calls :func:`resume_point` after loading the questions and before creating
the model (a refusal costs no model load), then :func:`load_model_state` once the model
exists. Every refusal is a :class:`~searchr1.core.errors.UserError` (exit code 2) naming
the file or field to fix:

- no checkpoint in the run folder: nothing to resume (never a silent fresh start);
- the newest checkpoint damaged: a warning naming its file, and the previous good one is
  used (see :func:`searchr1.core.checkpoint.resume_checkpoint`); none usable: an error;
- the checkpoint's data cursor recorded for another ``data.train`` or ``run.seed``: an error
  naming the data file the checkpoint was trained on and the one this run reads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomli

from searchr1.core.checkpoint import Checkpoint, resume_checkpoint
from searchr1.core.errors import UserError
from searchr1.core.logs import get_logger


def resume_point(ctx: Any, stream: Any) -> Checkpoint:
    """The checkpoint to continue ``ctx``'s run from, with ``stream`` moved to its cursor."""
    checkpoint, warnings = resume_checkpoint(ctx.run_dir)
    for warning in warnings:
        get_logger().warning("checkpoint_damaged", detail=warning)
        print(f"searchr1: warning: {warning}", file=sys.stderr)
    if checkpoint is None:
        raise UserError(
            f"--resume: nothing to resume: {ctx.run_dir} has no checkpoint "
            f"(checkpoints/step_*/); leave out --resume to start a new run there, or give the "
            f"--run-dir of the run to continue"
        )
    try:
        stream.load_state(checkpoint.state["data"])
    except ValueError as exc:
        raise UserError(_data_mismatch(ctx.config, checkpoint, exc)) from None
    return checkpoint


def _data_mismatch(config: Any, checkpoint: Checkpoint, exc: ValueError) -> str:
    saved = checkpoint.state["data"]
    before = _checkpoint_data_train(checkpoint.path)
    then = f"data.train = {before!r}" if before is not None else "another data file"
    count = saved.get("num_questions")
    return (
        f"--resume: {checkpoint.path} was trained on {then}"
        + (f" ({count} questions, run.seed = {saved.get('seed')})" if count is not None else "")
        + f", but this run reads data.train = {config.data.train!r} (run.seed = "
        f"{config.run.seed}): {exc}. Resume with the data.train and run.seed the checkpoint "
        f"was trained with, or start a new run (leave out --resume, or give a new --run-dir)."
    )


def _checkpoint_data_train(folder: Path) -> str | None:
    """``data.train`` from the config dump saved with the checkpoint, when readable."""
    try:
        saved = tomli.loads((folder / "config.toml").read_text("utf-8"))
        value = saved["data"]["train"]
    except (OSError, UnicodeDecodeError, tomli.TOMLDecodeError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


def load_model_state(components: Any, checkpoint: Checkpoint) -> None:
    """Load the trainer's state saved in ``checkpoint``; a missing or unreadable file there
    becomes a UserError naming the folder and the way out."""
    try:
        components.trainer.load_state(str(checkpoint.model_dir))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(
            f"--resume: the model state in {checkpoint.model_dir} cannot be loaded "
            f"({type(exc).__name__}: {exc}); move {checkpoint.path} aside to resume from the "
            f"checkpoint before it, or start a new run"
        ) from None
