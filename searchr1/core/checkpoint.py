"""Atomic checkpoints under ``runs/<run>/checkpoints/step_NNNNNN/``: ``model/`` (trainer
state), ``rng.pt`` (torch RNG), ``config.toml`` (redacted), and last ``trainer.json`` (step,
data cursor, Python RNG, and ``files``: the size of every other file). Written to a hidden
folder (``.step_NNNNNN-XXXX``, ``.best-XXXX``) renamed into place, so a crash (even SIGKILL)
never leaves a broken ``step_*``. One place finds and loads a checkpoint too: :func:`find_checkpoint`
from an ``eval --checkpoint`` spec, :func:`resume_checkpoint` for ``--resume``; both read
the config saved beside it (:func:`saved_config`), compare it (:func:`config_changes`) and
load the model state (:func:`load_trainer_state`).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from searchr1.core.artifacts import damage, file_sizes
from searchr1.core.config_schema import Config
from searchr1.core.disk import (
    as_disk_error,
    flock_folder,
    free_bytes,
    make_temp_dir,
    match_umask,
    used_bytes,
    warn_if_low_space,
)
from searchr1.core.errors import SearchR1Error, UserError
from searchr1.core.logs import get_logger
from searchr1.core.question_stream import cursor_problem
from searchr1.core.types import Trainer

KEEP = 3
#: the hidden folder of a save in progress: ``.`` + the checkpoint's name + ``-`` + mkdtemp's
#: random part
_SAVING_RE = re.compile(r"^\.(step_\d+|best)-[A-Za-z0-9_]+$")


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
    run_dir: Path,
    step: int,
    model: Trainer,
    config: Config,
    state: dict[str, Any],
    *,
    name: str | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the newest ``KEEP``. Warns
    first when the free space is under twice the last checkpoint's size; a write the disk
    refuses raises an ``OSError`` naming the checkpoint folder, with nothing of it left.
    ``name``: the folder under ``checkpoints/`` instead of ``step_NNNNNN`` (``best``; never
    pruned, never resumed from)."""
    import torch

    parent = checkpoints_dir(run_dir)
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / (name or f"step_{step:06d}")
    if final.exists() and not final.is_dir():
        raise CheckpointError(
            f"{final} is a file where train saves its checkpoint of step {step}; move the file "
            f"away and run train again (with --resume to continue from an earlier checkpoint)"
        )
    previous = list_checkpoints(run_dir)
    low = warn_if_low_space(parent, previous[-1].path if previous else None)
    if low:
        get_logger().warning("disk_space_low", detail=low)
    with _save_lock(parent):
        tmp = make_temp_dir(parent, f".{final.name}-")
        try:
            model.save_state(str(tmp / "model"))
            with (tmp / "rng.pt").open("wb") as fh:  # a file object: a full disk is an OSError
                torch.save({"torch": torch.get_rng_state()}, fh)
            config_text = tomli_w.dumps(toml_safe(config.to_dict(redact=True)))
            (tmp / "config.toml").write_text(config_text)
            match_umask(tmp)  # before the sizes: it may rewrite a file's mode, never its size
            trainer_state = {
                "step": step,
                "python_rng": _encode_rng(random.getstate()),
                **state,
                "files": file_sizes(tmp),
            }
            (tmp / "trainer.json").write_text(json.dumps(trainer_state, indent=1))
            _fsync_tree(tmp)
            if final.exists():  # re-saving the same step (a final save right after a periodic one)
                shutil.rmtree(final)
            os.rename(tmp, final)
        except Exception as exc:
            failure = _write_failure(exc, final, previous)
            if failure is exc:
                raise
            raise failure from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-KEEP]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


@contextmanager
def _save_lock(parent: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the flock of the folder ``parent`` (:func:`~searchr1.core.disk.flock_folder`).
    Yields False when ``wait`` is off and another process holds it, or where the filesystem
    has no such locks (then nothing can be known about other savers)."""
    try:
        fd = flock_folder(parent, wait=wait)
    except BlockingIOError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # releases the lock


def remove_stale_saves(run_dir: Path) -> list[Path]:
    """Delete the hidden folders of saves that were killed (see the module docstring) and
    return them. Only while holding the save lock, which every save in progress holds: when
    another process is saving into this run now, nothing is removed."""
    parent = checkpoints_dir(run_dir)
    if not parent.is_dir():
        return []
    with _save_lock(parent, wait=False) as held:
        if not held:
            return []
        stale = sorted(p for p in parent.iterdir() if p.is_dir() and _SAVING_RE.match(p.name))
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
    return stale


def _write_failure(exc: Exception, final: Path, previous: list[Checkpoint]) -> Exception:
    """What a failed save raises: an ``OSError`` naming ``final`` when the disk refused the
    write. torch writing to a path reports a full disk without an errno ("unexpected pos");
    then a disk with less free space than the last checkpoint took is taken to be full."""
    refused = as_disk_error(exc)
    if refused is not None:
        return OSError(refused.errno, refused.strerror, str(final))
    free = free_bytes(final.parent)
    needed = max(used_bytes(previous[-1].path) if previous else 0, 1 << 20)
    if not isinstance(exc, OSError) and free is not None and free < needed:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))
    return exc


class CheckpointError(UserError):
    """A checkpoint folder that cannot be used; the message names the file and why."""


def read_checkpoint(path: Path, *, resumable: bool = True) -> Checkpoint:
    """The checkpoint in ``path``, checked whole: ``trainer.json`` with a step, ``model/``
    with every file it recorded at its size (:func:`searchr1.core.artifacts.damage`), and if
    ``resumable`` (eval needs only the model) RNG state, data cursor and ``rng.pt``.
    Disk errors or hand edits still damage atomic saves; raises CheckpointError naming the
    file and what is wrong."""
    meta = path / "trainer.json"
    if not meta.is_file():
        raise CheckpointError(f"{meta} is missing")
    try:
        state = json.loads(meta.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{meta} is damaged (not readable JSON: {exc})") from None
    problem = _state_problem(state, resumable)
    if problem:
        raise CheckpointError(f"{meta} is damaged ({problem})")
    for needed in (path / "model", path / "rng.pt")[: 2 if resumable else 1]:
        if not needed.exists():
            raise CheckpointError(f"{needed} is missing")
    broken = damage(
        path,
        state.get("files"),
        only=lambda name: name != "trainer.json" and (resumable or name.startswith("model/")),
    )
    if broken:
        raise CheckpointError(broken)
    return Checkpoint(path=path, step=state["step"], state=state)


def _state_problem(state: Any, resumable: bool) -> str | None:
    if not isinstance(state, dict):
        return f"expected a JSON object, got {type(state).__name__}"
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"'step' must be a whole number >= 0, got {step!r}"
    files = state.get("files", {})  # absent in checkpoints written before sizes were kept
    if not (isinstance(files, dict) and all(isinstance(n, int) for n in files.values())):
        return "'files' is not a table of file sizes"
    if not resumable:
        return None
    rng = state.get("python_rng")
    if not (isinstance(rng, list) and len(rng) == 3 and isinstance(rng[1], list)):
        return "'python_rng' is not a saved random state"
    return cursor_problem(state.get("data"))


def scan_checkpoints(
    run_dir: Path, *, resumable: bool = True
) -> tuple[list[Checkpoint], list[tuple[Path, str]]]:
    """``(usable checkpoints oldest first, [(damaged folder, why)])``."""
    good: list[Checkpoint] = []
    damaged: list[tuple[Path, str]] = []
    for path in sorted(checkpoints_dir(run_dir).glob("step_*")):
        if not path.is_dir():
            continue
        try:
            good.append(read_checkpoint(path, resumable=resumable))
        except CheckpointError as exc:
            damaged.append((path, str(exc)))
    return sorted(good, key=lambda c: c.step), damaged


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Usable checkpoints, oldest first (damaged ones are left out: see scan_checkpoints)."""
    return scan_checkpoints(run_dir)[0]


def latest_checkpoint(run_dir: Path, *, resumable: bool = True) -> Checkpoint | None:
    found = scan_checkpoints(run_dir, resumable=resumable)[0]
    return found[-1] if found else None


def resume_checkpoint(run_dir: Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest usable checkpoint and a warning per newer damaged one (its steps are
    trained again). CheckpointError when none is usable; ``(None, [])`` if none exist."""
    good, damaged = scan_checkpoints(run_dir)
    if not good:
        if damaged:
            raise CheckpointError(
                f"--resume: {damaged[-1][1]}; there is no earlier usable checkpoint in "
                f"{checkpoints_dir(run_dir)}. Start a new run (leave out --resume, or give a "
                f"new --run-dir)."
            )
        return None, []
    latest = good[-1]
    warnings = [
        f"{why}; resuming from the previous good checkpoint {latest.path} (step {latest.step}) "
        f"instead, so the steps after it are trained again"
        for path, why in damaged
        if _folder_step(path) > latest.step
    ]
    return latest, warnings


def _folder_step(path: Path) -> int:
    digits = path.name.removeprefix("step_")
    return int(digits) if digits.isdigit() else -1


def restore_rng(checkpoint: Checkpoint) -> None:
    """Put Python's and torch's global RNGs back where they were at save time."""
    import torch

    try:
        random.setstate(_decode_rng(checkpoint.state["python_rng"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{checkpoint.path / 'trainer.json'} is damaged (python_rng: {exc}); move "
            f"{checkpoint.path} aside to resume from the checkpoint before it"
        ) from None
    file = checkpoint.path / "rng.pt"
    try:
        rng = torch.load(file, weights_only=True)
        torch.set_rng_state(rng["torch"])
    except Exception as exc:  # torch raises several types for a truncated or foreign file
        raise CheckpointError(
            f"{file} is damaged ({type(exc).__name__}: {exc}); move {checkpoint.path} "
            f"aside to resume from the checkpoint before it"
        ) from None


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def toml_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: toml_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [toml_safe(v) for v in value]
    return value


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


# --------------------------------------------------------------------------- finding one

#: the model itself, no checkpoint (``eval --checkpoint base``)
BASE = "base"
#: the folder under ``checkpoints/`` that ``train.keep_best`` keeps (``searchr1 eval
#: --checkpoint RUN:best``); the step checkpoints' pruning never touches it
BEST = "best"


def saved_config(folder: Path) -> dict[str, Any]:
    """The config saved with the checkpoint in ``folder`` (``config.toml``, secrets
    redacted); OSError when unreadable, ValueError when not UTF-8 or not TOML."""
    import tomllib

    return tomllib.loads((folder / "config.toml").read_text("utf-8"))


def config_changes(
    config: Config, saved: Mapping[str, Any], within: Sequence[str]
) -> list[tuple[str, Any, Any]]:
    """``(dotted, saved value, config's value)`` of each setting under ``within`` (sections,
    or dotted fields) where ``config`` differs from a checkpoint's ``saved`` config, both
    compared as saved (redacted TOML values); a value one side lacks is None there. In
    ``within``'s sections' order, then the config's."""
    sections = list(dict.fromkeys(w.partition(".")[0] for w in within))
    ours = dotted_leaves(toml_safe({s: config.to_dict(redact=True)[s] for s in sections}))
    theirs = dotted_leaves({s: saved.get(s, {}) for s in sections})
    return [
        (key, theirs.get(key), ours.get(key))
        for key in dict.fromkeys([*ours, *theirs])
        if any(key == w or key.startswith(w + ".") for w in within)
        and ours.get(key) != theirs.get(key)
    ]


def dotted_leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a nested table."""
    if not isinstance(doc, dict):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out.update(dotted_leaves(value, f"{prefix}.{key}" if prefix else key))
    return out


async def load_trainer_state(
    trainer: Trainer, model_dir: Path | str, cannot: Callable[[Exception], str]
) -> None:
    """Load the model state in ``model_dir`` into ``trainer`` (resume, eval). Files it cannot
    read, or a provider that cannot load states (NotImplementedError), are the UserError
    ``cannot(exc)`` words; an error of ours passes unchanged (it names what failed, e.g. a
    server the loaded weights go to)."""
    try:
        await trainer.load_state(str(model_dir))
    except SearchR1Error:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(cannot(exc)) from None


def find_checkpoint(spec: str) -> tuple[str, str | None]:
    """``(label, folder to pass to trainer.load_state)`` for one ``eval --checkpoint`` value.

    Accepts ``base`` (no folder), a train checkpoint (``.../checkpoints/step_000020``, holding
    ``trainer.json`` and ``model/``; labelled ``step_20``), a run folder (its latest usable
    checkpoint), ``RUN:best`` (the run's ``checkpoints/best``, kept by ``[train] keep_best``;
    labelled ``best_step_20``), or a model state folder a provider's ``save_state`` wrote
    (labelled by its name). Anything else is refused here, before any model is loaded."""
    if spec == BASE:
        return BASE, None
    path = Path(spec)
    run_dir, colon, name = spec.rpartition(":")
    if colon and run_dir and not path.exists() and "/" not in name:  # RUN:<name>
        path = _named_checkpoint(spec, Path(run_dir), name)
    if not path.is_dir():
        raise UserError(f"--checkpoint {spec!r}: not a folder")
    if checkpoints_dir(path).is_dir():
        path = _newest_usable(spec, path)
    if (path / "trainer.json").exists():
        return _train_checkpoint(spec, path)
    if any((path / marker).exists() for marker in MODEL_STATE_MARKERS):
        broken = damage(path, None)  # no sizes recorded here: the files' own headers
        if broken:
            raise UserError(f"--checkpoint {spec!r}: {broken}; the model state cannot be loaded")
        return path.resolve().name, str(path)
    raise UserError(
        f"--checkpoint {spec!r}: not a checkpoint: expected a train checkpoint folder "
        f"(runs/<run>/checkpoints/step_NNNNNN, with trainer.json and model/), a run folder "
        f"holding checkpoints/, a model state folder (its model/ subfolder), or 'base'"
        + _nearby_runs(path)
    )


def _named_checkpoint(spec: str, run_dir: Path, name: str) -> Path:
    """The folder of ``RUN:<name>``: ``best`` only, and the run must have kept one."""
    is_run = checkpoints_dir(run_dir).is_dir()
    if name != BEST:
        raise UserError(
            f"--checkpoint {spec!r}: {run_dir} has no checkpoint named {name!r}"
            + ("" if is_run else f" ({run_dir} is not a run folder: no checkpoints/ in it)")
            + f": RUN:<name> takes {BEST} only (the run's best held-out checkpoint, "
            "[train] keep_best)" + _run_checkpoints(run_dir)
        )
    path = checkpoints_dir(run_dir) / BEST
    if not (path / "trainer.json").is_file():
        raise UserError(
            f"--checkpoint {spec!r}: {path} holds no checkpoint: "
            + (
                "the run kept no best checkpoint (train it with [train] keep_best = true "
                "and eval_every > 0)"
                if is_run
                else f"{run_dir} is not a run folder (no checkpoints/ in it)"
            )
        )
    return path


def _newest_usable(spec: str, run_dir: Path) -> Path:
    """A run folder's newest usable checkpoint (a newer damaged one is warned about)."""
    good, damaged = scan_checkpoints(run_dir, resumable=False)
    if not good:
        raise UserError(
            f"--checkpoint {spec!r}: run folder without a usable checkpoint "
            f"(nothing complete under {checkpoints_dir(run_dir)})"
            + "".join(f"; {why}" for _, why in damaged)
        )
    for folder, why in damaged:
        if folder.name > good[-1].path.name:  # step_NNNNNN: names sort as steps
            print(
                f"searchr1: warning: {why}; evaluating the newest usable checkpoint "
                f"{good[-1].path} instead",
                file=sys.stderr,
            )
    return good[-1].path


def _train_checkpoint(spec: str, path: Path) -> tuple[str, str]:
    """``(label, model folder)`` of a train checkpoint, read and checked."""
    try:
        checkpoint = read_checkpoint(path, resumable=False)
    except CheckpointError as exc:
        raise UserError(
            f"--checkpoint {spec!r}: {exc}; the checkpoint cannot be evaluated"
            + _run_checkpoints(path.parent.parent, usable_only=True)
        ) from None
    label = f"{BEST}_step_{checkpoint.step}" if path.name == BEST else ""
    return label or f"step_{checkpoint.step}", str(checkpoint.model_dir)


#: files a model provider's ``save_state`` writes at the top of its folder (local:
#: trainer_state.json + adapter/; remote: remote_checkpoint.json); their presence is what
#: tells a model state folder from any other folder
MODEL_STATE_MARKERS = ("trainer_state.json", "adapter", "remote_checkpoint.json")


def _run_checkpoints(run_dir: Path, *, usable_only: bool = False) -> str:
    """``; the run's (usable) checkpoints: ...`` for a message, or ``""`` when it has none."""
    if not checkpoints_dir(run_dir).is_dir():
        return ""
    good, damaged = scan_checkpoints(run_dir, resumable=False)
    found = sorted(
        [str(c.path) for c in good] + ([] if usable_only else [str(p) for p, _ in damaged])
    )
    if not found:
        return ""
    what = "usable checkpoints" if usable_only else "checkpoints"
    return f"; the run's {what}: {', '.join(found)}"


def _nearby_runs(path: Path) -> str:
    """A hint when ``path`` holds run folders (the user gave ``runs/`` itself)."""
    runs = sorted(str(p.parent) for p in path.glob("*/checkpoints") if p.is_dir())[:3]
    return f"; run folders inside it: {', '.join(runs)}" if runs else ""
