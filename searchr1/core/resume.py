"""``searchr1 train --resume``: pick the checkpoint to continue from and check it fits the
run. :func:`resume_point` runs before the model is created (a refusal costs no model load),
:func:`load_model_state` after. Every refusal is a UserError naming what to fix: no
checkpoint (but an earlier ``train`` there that stopped before its first checkpoint starts
again from step 1, with a warning: ``--resume`` after any stop works), none usable (a damaged newest one only warns and
the previous good one is used), a data cursor for another ``data.train`` / ``run.seed``, or
an adapter of another shape (:data:`ADAPTER_FIELDS`); another ``base_model`` only warns (the
same model may have moved: a host path, then a container's).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.checkpoint import (
    Checkpoint,
    checkpoints_dir,
    config_changes,
    load_trainer_state,
    resume_checkpoint,
    saved_config,
)
from searchr1.core.errors import UserError
from searchr1.core.logs import warn
from searchr1.core.question_stream import QuestionStream

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config
    from searchr1.core.distributed import World
    from searchr1.core.types import Trainer


def resume_point(
    folder: Path, config: Config, world: World, stream: QuestionStream
) -> Checkpoint | None:
    """The checkpoint in the run ``folder`` to continue from under ``config``, with
    ``stream`` moved to its cursor; None when an earlier ``train`` in the folder stopped
    before any checkpoint (nothing was trained: the run starts from step 1, said by
    ``resume_fresh_start``). Every rank of ``world`` calls it."""
    checkpoint, warnings = resume_checkpoint(folder)
    for warning in warnings:
        warn("checkpoint_damaged", warning)
    untrained = checkpoint is None and not any(checkpoints_dir(folder).glob("step_*"))
    if untrained and world.broadcast(_train_starts(folder) > 1 if world.main else None):
        warn(
            "resume_fresh_start",
            f"--resume: {folder} holds an earlier train run that stopped before any "
            f"checkpoint (no step was trained): starting it from step 1",
        )
        return None
    if checkpoint is None:
        raise UserError(
            f"--resume: nothing to resume: {folder} has no checkpoint "
            f"(checkpoints/step_*/); leave out --resume to start a new run there, or give the "
            f"--run-dir of the run to continue"
        )
    saved = _saved_config(checkpoint.path)
    if changed := _changes(config, saved, ADAPTER_FIELDS):
        then = ", ".join(f"{d} = {old!r}" for d, old, _ in changed)
        now = ", ".join(f"{d} = {new!r} ({config.where(d)})" for d, _, new in changed)
        raise UserError(
            f"--resume: {checkpoint.path} holds an adapter trained with {then}; this config has "
            f"{now}. Resume with the values it was trained with (its config: "
            f"{checkpoint.path / 'config.toml'}), or start a new run (leave out --resume, or "
            f"give a new --run-dir)"
        )
    for dotted, then, now in _changes(config, saved, ("model.base_model",)):
        warn(
            "resume_base_model_changed",
            f"{checkpoint.path} was trained on {dotted} = {then!r}, this config has {now!r}: the "
            f"adapter continues on {now!r}; right if it is the same model under another path",
        )
    try:
        stream.load_state(checkpoint.state["data"])
    except ValueError as exc:
        raise UserError(_data_mismatch(config, checkpoint, saved, exc)) from None
    if checkpoint.step >= (last := config.train.max_steps):
        # not an error: a resume at max_steps still runs a final eval a stop cut short
        where = config.where("train.max_steps")
        fix = (
            "give a larger --max-steps"
            if where.startswith("--")
            else "raise train.max_steps (or give --max-steps)"
        )
        warn(
            "resume_nothing_to_train",
            f"{checkpoint.path} is at step {checkpoint.step} and train.max_steps is {last} "
            f"({where}): no step is left to train; to train on, {fix}",
        )
    return checkpoint


def _train_starts(folder: Path) -> int:
    """How many ``train`` processes started in ``folder`` (its events.jsonl's ``run_start``
    events: this process's is one)."""
    import json

    starts = 0
    try:
        with (folder / "events.jsonl").open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if '"run_start"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                starts += event.get("event") == "run_start" and event.get("command") == "train"
    except OSError:
        return 0
    return starts


#: the settings that make the adapter what it is: a checkpoint resumes only under the same
#: values (another rank or target list does not load; another alpha rescales every update)
ADAPTER_FIELDS = ("lora.rank", "lora.alpha", "lora.target_modules")


def _changes(
    config: Any, saved: dict[str, Any], fields: tuple[str, ...]
) -> list[tuple[str, Any, Any]]:
    """``(dotted, saved value, this config's value)`` of each of ``fields`` that differs (one
    the saved config lacks is taken as unchanged)."""
    return [change for change in config_changes(config, saved, fields) if change[1] is not None]


def _data_mismatch(
    config: Any, checkpoint: Checkpoint, saved_config: dict[str, Any], exc: ValueError
) -> str:
    saved = checkpoint.state["data"]
    before = saved_config.get("data", {}).get("train")
    then = f"data.train = {before!r}" if isinstance(before, str) else "another data file"
    count = saved.get("num_questions")
    return (
        f"--resume: {checkpoint.path} was trained on {then}"
        + (f" ({count} questions, run.seed = {saved.get('seed')})" if count is not None else "")
        + f", but this run reads data.train = {config.data.train!r} (run.seed = "
        f"{config.run.seed}): {exc}. Resume with the data.train and run.seed the checkpoint "
        f"was trained with, or start a new run (leave out --resume, or give a new --run-dir)."
    )


def _saved_config(folder: Path) -> dict[str, Any]:
    """The config dump saved with the checkpoint (empty when unreadable: nothing to compare)."""
    try:
        return saved_config(folder)
    except (OSError, ValueError):  # ValueError: not UTF-8, or not TOML
        return {}


async def load_model_state(trainer: Trainer, config: Config, checkpoint: Checkpoint) -> None:
    """Load ``checkpoint``'s saved state into ``trainer`` (of ``config``'s model provider); a
    missing or unreadable file is a UserError."""

    def cannot(exc: Exception) -> str:
        saved = _saved_config(checkpoint.path).get("model")
        then = saved.get("provider") if isinstance(saved, dict) else None
        now = config.model.provider
        if isinstance(then, str) and then and then != now:  # a provider reads its own states
            fix = (
                f"it was saved by model provider {then!r} and this run's is {now!r}: resume "
                f"with [model] provider = {then!r}, or start a new run"
            )
        else:
            fix = (
                f"move {checkpoint.path} aside to resume from the checkpoint before it, or "
                f"start a new run"
            )
        return (
            f"--resume: the model state in {checkpoint.model_dir} cannot be loaded "
            f"({type(exc).__name__}: {exc}); {fix}"
        )

    await load_trainer_state(trainer, checkpoint.model_dir, cannot)
