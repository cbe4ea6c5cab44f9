"""One command's run: its folder, logging, plugins and the four plugin instances chosen
**by name** in the config (model, search provider, reward, loss).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.assets import cache_dir
from searchr1.core.checkpoint import latest_checkpoint
from searchr1.core.config_schema import Config
from searchr1.core.config_validate import advice, check_plugin_choices
from searchr1.core.disk import (
    describe_refusal,
    is_disk_error,
    resume_command,
    track_run,
    tracked_run,
)
from searchr1.core.errors import ConfigError, DiskError, PluginError, UserError
from searchr1.core.logs import attach_sinks, get_logger, setup_logging
from searchr1.core.plugins import Registry, load_registry
from searchr1.core.sinks import open_sinks
from searchr1.core.trainer_checks import check_loss, require_trainer
from searchr1.core.types import LossFn, Model, RewardFn, SearchProvider, Trainer


@dataclass(frozen=True)
class RunContext:
    config: Config
    run_dir: Path
    run_id: str
    registry: Registry


@dataclass
class Components:
    model: Model
    search: SearchProvider
    reward: RewardFn
    loss: LossFn

    @property
    def trainer(self) -> Trainer:
        """The model's trainer (``build_components(need_loss=True)`` refuses a model
        without one, naming the provider)."""
        if self.model.trainer is None:
            raise ConfigError(["model.provider: the model only samples; training needs a trainer"])
        return self.model.trainer


def create_model(registry: Registry, config: Config) -> Model:
    """The ``[model] provider``'s Model; any other return is a PluginError."""
    model = registry.create("model_provider", config.model.provider, config)
    if not isinstance(model, Model):  # the factory's return type, not an ability
        raise PluginError(
            f"model.provider = {config.model.provider!r}: its factory returned a "
            f"{type(model).__name__}, not a searchr1.core.types.Model(sampler=..., "
            f"trainer=...); see docs/plugins.md"
        )
    return model


def new_run_id(command: str) -> str:
    return f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def latest_run_dir(parent: Path, command: str) -> Path | None:
    """The most recently modified ``<command>-*`` run folder under ``parent``."""
    runs = sorted(parent.glob(f"{command}-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def open_run(
    config: Config,
    command: str,
    *,
    run_dir: str | None = None,
    resume: bool = False,
    registry: Registry | None = None,
    **log_kwargs: Any,
) -> RunContext:
    """Choose the run folder and start logging into it, with ``registry``'s plugins (None:
    the installed ones). Plugin names are resolved before the folder is created."""
    registry = registry or load_registry()
    check_plugin_choices(config, registry)  # a typo is named before any plugin starts
    run_dir_path = _choose_run_dir(config, command, given=run_dir, resume=resume)
    run_id = run_dir_path.name
    track_run(run_dir_path, command, config.source)  # a disk error names its checkpoint
    if command == "train":
        log_kwargs.setdefault("total_steps", config.train.max_steps)
    setup_logging(run_id, run_dir_path / "events.jsonl", secrets=config.secrets, **log_kwargs)
    if command == "train":  # metric sinks: [log] sinks (events.jsonl is always on)
        attach_sinks(open_sinks(config, registry, run_dir_path))
    get_logger().info(
        "run_start", command=command, run_dir=str(run_dir_path), config_source=config.source
    )
    announce_config(config, registry)
    return RunContext(config=config, run_dir=run_dir_path, run_id=run_id, registry=registry)


def announce_config(config: Config, registry: Registry | None = None) -> list[str]:
    """Print (``warning: ...``) and log (``config_warning``) what the run should know:
    inferred provider/protocol, literal secrets, empty exported variables, plugin advice
    (:func:`searchr1.core.config_validate.advice`). Returns the warnings."""
    log = get_logger()
    for dotted, reason in config.choices.items():
        if reason.startswith("not set"):
            section, key = dotted.split(".", 1)
            value = getattr(getattr(config, section), key)
            print(f"{dotted} = {value!r}: {reason}")
            log.info("config_choice", field=dotted, value=value, reason=reason)
    warnings = [*config.warnings, *advice(config, registry)]
    for line in warnings:
        print(f"warning: {line}")
        log.warning("config_warning", detail=line)
    return warnings


def _choose_run_dir(config: Config, command: str, *, given: str | None, resume: bool) -> Path:
    """The run folder (created): ``--run-dir``, else on ``--resume`` the ``run.name`` run
    or the latest ``<command>-*`` one, else a new one (``run.name`` or a timestamp). Nothing
    to resume, or a file path, is a UserError naming the flag or field (exit code 2)."""
    parent = Path(config.run.dir)
    if given:
        run_dir, origin = Path(given), f"--run-dir {given}"
    elif resume and config.run.name:
        run_dir, origin = parent / config.run.name, f"run.name = {config.run.name!r}"
    elif resume:
        found = latest_run_dir(parent, command) if parent.is_dir() else None
        if found is None:
            raise UserError(
                f"--resume: nothing to resume: no earlier {command}-* run folder in "
                f"{str(parent)!r} (run.dir). Leave out --resume to start a new run, or name "
                f"the run to continue with --run-dir."
            )
        run_dir, origin = found, f"run.dir = {str(parent)!r}"
    else:
        run_dir = parent / (config.run.name or new_run_id(command))
        origin = f"run.dir = {str(parent)!r}"
    if resume and not run_dir.is_dir():
        raise UserError(
            f"--resume: nothing to resume: {str(run_dir)!r} ({origin}) does not exist. Leave "
            f"out --resume to start a new run there."
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(
            f"{origin}: {str(run_dir)!r} is a file, not a folder; give a folder for the run "
            f"(it is created if missing)"
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL character in the path
        if is_disk_error(exc):  # read-only, full, no permission: the CLI's disk error
            raise
        reason = getattr(exc, "strerror", None) or exc
        raise UserError(
            f"{origin}: cannot create the run folder {str(run_dir)!r}: {reason} "
            f"(a file in the path, or a character a path cannot hold)"
        ) from None
    return run_dir


def disk_error(exc: OSError) -> DiskError:
    """The one message for a write the disk refused (:mod:`searchr1.core.disk`): the path,
    the free space there, the run's last complete checkpoint and the command that continues
    it (or, outside ``train``, to run the command again)."""
    run = tracked_run()
    lines, advice = describe_refusal(exc, run.run_dir if run else None)
    if exc.filename and _is_under(Path(exc.filename), cache_dir()):
        advice += " (the cache folder is $SEARCHR1_CACHE, default ~/.cache/searchr1)"
    if run is not None and run.command == "train":
        last = latest_checkpoint(run.run_dir)
        if last is not None:
            lines.append(f"last complete checkpoint: {last.path} (step {last.step})")
            lines.append(f"{advice}, then continue the run with:")
            lines.append(f"  {resume_command(run.run_dir, run.config_source)}")
        else:
            lines.append(f"no complete checkpoint yet in {run.run_dir}")
            lines.append(f"{advice}, then start the run again")
    else:
        lines.append(f"{advice}, then run the command again")
    return DiskError("\n".join(lines))


def _is_under(path: Path, folder: Path) -> bool:
    try:
        return path.absolute().is_relative_to(folder.absolute())
    except (OSError, ValueError):
        return False


def build_components(ctx: RunContext, *, need_loss: bool = True) -> Components:
    """Create the four plugins named in the config (model last: slowest). With
    ``need_loss``, a model without a trainer, or a loss its trainer cannot train, is refused
    before any rollout (:func:`~searchr1.core.trainer_checks.require_trainer`); the model is
    closed then."""
    cfg, reg = ctx.config, ctx.registry
    search = reg.create("search_provider", cfg.search.provider, cfg)
    try:
        reward = reg.create("reward", cfg.reward.name, cfg)
        loss = reg.create("loss_fn", cfg.train.loss_fn, cfg) if need_loss else None
        model = create_model(reg, cfg)
        if loss is not None:
            try:
                trainer = require_trainer(model, cfg.model.provider)
                check_loss(
                    trainer.capabilities, loss, field="train.loss_fn", provider=cfg.model.provider
                )
            except BaseException:
                model.close()
                raise
    except BaseException:
        # The search provider may hold connections; a failed start must not leak them.
        asyncio.run(search.aclose())
        raise
    return Components(model=model, search=search, reward=reward, loss=loss)  # type: ignore[arg-type]
