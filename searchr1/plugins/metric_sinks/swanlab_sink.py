"""The ``swanlab`` metric sink: a SwanLab experiment per searchr1 run (optional extra).

Chosen by ``[log] sinks = ["swanlab"]``; needs ``pip install 'searchr1[swanlab]'``. SwanLab
is the tracker the public replication of Search-R1 logged to. The experiment is named after
the searchr1 run and keeps its files under ``runs/<run>/swanlab/``; its config is searchr1's
redacted config, steps are training steps, and each step's dumped trajectories are logged as
``trajectories`` texts. SwanLab's terminal capture and hardware probe are off, and it never
asks for input (a missing login is an error, reported once, not a prompt that stalls
training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.kit.sinks import missing_package
from searchr1.sdk import Config, UserError, plugin_settings


@dataclass(frozen=True)
class SwanLabSettings:
    project: str = "searchr1"
    workspace: str = ""
    group: str = ""
    tags: tuple[str, ...] = ()
    mode: str = field(
        default="", metadata={"choices": ("", "online", "local", "offline", "disabled")}
    )


def open_swanlab(config: Config, run_dir: Path) -> SwanLabSink:
    settings = plugin_settings(config, "log", "swanlab", SwanLabSettings)
    try:
        import swanlab
    except ImportError as exc:
        raise missing_package("swanlab", "swanlab", "searchr1[swanlab]") from exc
    options = swanlab.Settings(
        interactive=False,
        terminal=swanlab.Settings.Terminal(proxy_type="none"),
        probe=swanlab.Settings.Probe(hardware=False, runtime=False, monitor=False),
    )
    try:
        run = swanlab.init(
            project=settings.project,
            workspace=settings.workspace or None,
            group=settings.group or None,
            tags=list(settings.tags) or None,
            name=run_dir.name,
            log_dir=str(run_dir / "swanlab"),
            mode=settings.mode or None,
            settings=options,
            reinit=True,
        )
    except RuntimeError as exc:
        # Not logged in: the user's to fix, so stop before the model loads (any other
        # failure, e.g. the network, only drops this sink with a warning).
        if "API key" not in str(exc):
            raise
        raise UserError(
            f"log.sinks lists 'swanlab' but SwanLab is not logged in ({exc}): set "
            'SWANLAB_API_KEY, run `swanlab login`, or set [log.swanlab] mode = "offline"'
        ) from exc
    return SwanLabSink(run, swanlab)


class SwanLabSink:
    def __init__(self, run: Any, swanlab: Any):
        self.run, self.swanlab = run, swanlab

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config))

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        self.run.log({name: [self.swanlab.Text(t) for t in texts]}, step=step)

    def close(self) -> None:
        self.run.finish()
