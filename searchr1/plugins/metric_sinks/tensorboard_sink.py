"""The ``tensorboard`` metric sink: event files under ``runs/<run>/tensorboard/``.

Chosen by ``[log] sinks = ["tensorboard"]``; ``tensorboard --logdir runs`` then shows every
run side by side. Scalars keep searchr1's names (``reward/mean``, ``search/success_rate``),
so TensorBoard groups them by prefix. Trajectories are text (tag ``trajectories``), the
redacted config is both the HParams entry of the run and a ``config`` text. Written with
``torch.utils.tensorboard`` (torch is already loaded by training), which needs the
``tensorboard`` package, a dependency of searchr1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.kit.sinks import missing_package
from searchr1.sdk import Config, plugin_settings


@dataclass(frozen=True)
class TensorBoardSettings:
    dir: str = ""


def open_tensorboard(config: Config, run_dir: Path) -> TensorBoardSink:
    settings = plugin_settings(config, "log", "tensorboard", TensorBoardSettings)
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        # a dependency of searchr1: only a partial install lacks it
        raise missing_package("tensorboard", "tensorboard", "tensorboard>=2.14") from exc
    log_dir = Path(settings.dir) / run_dir.name if settings.dir else run_dir / "tensorboard"
    return TensorBoardSink(SummaryWriter(log_dir=str(log_dir), flush_secs=30))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"max_steps": 2}}`` -> ``{"train.max_steps": 2}``; lists become text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out


class TensorBoardSink:
    """Writes through one ``SummaryWriter``; flushes after every step so a live TensorBoard
    (and a crash) sees each step as soon as it is logged.

    A resumed run (``--resume``) logs again the steps its killed predecessor logged after
    the last checkpoint. Its first step is past 1, so the sink first writes a session-start
    event at that step, which tells TensorBoard to drop the older points from that step on
    (what ``SummaryWriter(purge_step=...)`` does): each curve keeps one point per step."""

    def __init__(self, writer: Any):
        self.writer = writer
        self._first_step = True

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        flat = flatten(config)
        # The metric named here lets the HParams dashboard show it next to the settings.
        experiment, session_start, _ = hparams(flat, {"reward/mean": 0.0})
        for summary in (experiment, session_start):
            self.writer.file_writer.add_summary(summary)
        text = "\n".join(f"    {k} = {v}" for k, v in flat.items())  # indented = verbatim
        self.writer.add_text("config", text, 0)
        self.writer.flush()

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._first_step:
            self._first_step = False
            if step > 1:  # a resumed run: see the class docstring
                self._purge_from(step)
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        blocks = ["\n".join(f"    {line}" for line in t.splitlines()) for t in texts]
        self.writer.add_text(name, "\n\n---\n\n".join(blocks), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _purge_from(self, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        event = Event(step=step, session_log=SessionLog(status=SessionLog.START))
        self.writer.file_writer.add_event(event)
