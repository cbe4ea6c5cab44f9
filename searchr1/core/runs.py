"""One command's run: its folder, logging, plugins and the four chosen plugin instances.

``train``, ``smoke`` and ``eval`` call :func:`open_run` first; it loads the config (or the
embedded default), applies CLI overrides, creates ``runs/<run>/``, starts the JSON event log
there and loads the plugin registry. :func:`build_components` then creates the model
provider, search provider, reward and loss chosen **by name** in the config.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.config import Config, load_config
from searchr1.core.logs import attach_sinks, get_logger, setup_logging
from searchr1.core.plugins import Registry, load_registry
from searchr1.core.sinks import open_sinks
from searchr1.core.types import LossFn, ModelProvider, RewardFn, SearchProvider


@dataclass(frozen=True)
class RunContext:
    config: Config
    run_dir: Path
    run_id: str
    registry: Registry


@dataclass
class Components:
    model: ModelProvider
    search: SearchProvider
    reward: RewardFn
    loss: LossFn


def new_run_id(command: str) -> str:
    return f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def latest_run_dir(parent: Path, command: str) -> Path | None:
    """The most recently modified ``<command>-*`` run folder under ``parent``."""
    runs = sorted(parent.glob(f"{command}-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def open_run(
    args: argparse.Namespace, command: str, *, config: Config | None = None, **log_kwargs: Any
) -> RunContext:
    """Load config and plugins, choose the run folder and start logging into it.

    ``--run-dir`` wins; else ``--resume`` reuses the latest ``<command>-*`` folder under
    ``run.dir``; else a new folder named after ``run.name`` or a timestamp."""
    config = config or load_config(getattr(args, "config", None))
    max_steps = getattr(args, "max_steps", None)
    if max_steps is not None:
        config = config.replace(train={"max_steps": max_steps})
    parent = Path(config.run.dir)
    run_dir: Path | None = Path(args.run_dir) if getattr(args, "run_dir", None) else None
    if run_dir is None and getattr(args, "resume", False):
        run_dir = latest_run_dir(parent, command)
    if run_dir is None:
        run_dir = parent / (config.run.name or new_run_id(command))
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_dir.name
    if command == "train":
        log_kwargs.setdefault("total_steps", config.train.max_steps)
    setup_logging(run_id, run_dir / "events.jsonl", secrets=config.secrets, **log_kwargs)
    registry = load_registry()
    if command == "train":  # metric sinks: [log] sinks (events.jsonl is always on)
        attach_sinks(open_sinks(config, registry, run_dir))
    get_logger().info(
        "run_start", command=command, run_dir=str(run_dir), config_source=config.source
    )
    return RunContext(config=config, run_dir=run_dir, run_id=run_id, registry=registry)


def build_components(ctx: RunContext, *, need_loss: bool = True) -> Components:
    """Create the four plugins named in the config (model last: it is the slowest)."""
    cfg, reg = ctx.config, ctx.registry
    search = reg.create("search_provider", cfg.search.provider, cfg)
    try:
        reward = reg.create("reward", cfg.reward.name, cfg)
        loss = reg.create("loss_fn", cfg.train.loss_fn, cfg) if need_loss else None
        model = reg.create("model_provider", cfg.model.provider, cfg)
    except BaseException:
        # The search provider may hold connections; a failed start must not leak them.
        asyncio.run(search.aclose())
        raise
    return Components(model=model, search=search, reward=reward, loss=loss)  # type: ignore[arg-type]
