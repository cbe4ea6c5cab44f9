"""``searchr1 train --resume``: pick the checkpoint to continue from and check it fits the
run. :func:`resume_point` runs before the model is created (a refusal costs no model load),
:func:`load_model_state` after. Every refusal is a UserError naming what to fix: no
checkpoint (never a silent fresh start), none usable (a damaged newest one only warns and
the previous good one is used), or a data cursor for another ``data.train`` / ``run.seed``.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.checkpoint import Checkpoint, resume_checkpoint
from searchr1.core.errors import SearchR1Error, UserError
from searchr1.core.logs import get_logger
from searchr1.core.question_stream import QuestionStream

if TYPE_CHECKING:
    from searchr1.core.runs import Run


def resume_point(run: Run, stream: QuestionStream) -> Checkpoint:
    """The checkpoint to continue ``run`` from, with ``stream`` moved to its cursor."""
    checkpoint, warnings = resume_checkpoint(run.folder)
    for warning in warnings:
        get_logger().warning("checkpoint_damaged", detail=warning)
        print(f"searchr1: warning: {warning}", file=sys.stderr)
    if checkpoint is None:
        raise UserError(
            f"--resume: nothing to resume: {run.folder} has no checkpoint "
            f"(checkpoints/step_*/); leave out --resume to start a new run there, or give the "
            f"--run-dir of the run to continue"
        )
    try:
        stream.load_state(checkpoint.state["data"])
    except ValueError as exc:
        raise UserError(_data_mismatch(run.config, checkpoint, exc)) from None
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
        saved = tomllib.loads((folder / "config.toml").read_text("utf-8"))
        value = saved["data"]["train"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


async def load_model_state(run: Run, checkpoint: Checkpoint) -> None:
    """Load the trainer's saved state; a missing or unreadable file is a UserError."""
    try:
        await run.trainer.load_state(str(checkpoint.model_dir))
    except SearchR1Error:
        raise  # it says what failed (e.g. a server the loaded weights go to), not the files
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(
            f"--resume: the model state in {checkpoint.model_dir} cannot be loaded "
            f"({type(exc).__name__}: {exc}); move {checkpoint.path} aside to resume from the "
            f"checkpoint before it, or start a new run"
        ) from None
