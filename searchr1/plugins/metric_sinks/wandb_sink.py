"""The ``wandb`` metric sink: a Weights & Biases run per searchr1 run (optional extra).

Chosen by ``[log] sinks = ["wandb"]``; needs ``pip install 'searchr1[wandb]'``. The W&B run
is named after the searchr1 run and keeps its files under ``runs/<run>/wandb/``. Its config
is searchr1's redacted config; steps are training steps; each step's dumped trajectories are
a table ``trajectories`` with one ``text`` column. W&B's capture of the terminal is turned
off: the console stays searchr1's, and nothing printed goes to W&B.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.kit.sinks import missing_package
from searchr1.sdk import Config, UserError, plugin_settings


@dataclass(frozen=True)
class WandbSettings:
    project: str = "searchr1"
    entity: str = ""
    group: str = ""
    tags: tuple[str, ...] = ()
    mode: str = field(default="", metadata={"choices": ("", "online", "offline", "disabled")})


def open_wandb(config: Config, run_dir: Path) -> WandbSink:
    settings = plugin_settings(config, "log", "wandb", WandbSettings)
    try:
        import wandb
    except ImportError as exc:
        raise missing_package("wandb", "wandb", "searchr1[wandb]") from exc
    mode = settings.mode or os.environ.get("WANDB_MODE", "") or "online"
    # Without credentials, wandb.init asks on the terminal (a run left waiting for a choice)
    # or fails deep inside; say what to do before the model loads instead.
    if mode == "online" and not wandb.login(prompt=False, verify=False):
        raise UserError(
            "log.sinks lists 'wandb' but W&B has no API key here: set WANDB_API_KEY (in the "
            'environment or .env), run `wandb login`, or set [log.wandb] mode = "offline"'
        )
    run = wandb.init(
        project=settings.project,
        entity=settings.entity or None,
        group=settings.group or None,
        tags=list(settings.tags) or None,
        name=run_dir.name,
        dir=str(run_dir),
        mode=settings.mode or None,
        settings=wandb.Settings(console="off", silent=True),
    )
    return WandbSink(run, wandb)


class WandbSink:
    def __init__(self, run: Any, wandb: Any):
        self.run, self.wandb = run, wandb

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        table = self.wandb.Table(columns=["text"], data=[[t] for t in texts])
        self.run.log({name: table}, step=step)

    def close(self) -> None:
        self.run.finish()
