"""One command's :class:`Run`: its config, folder, event stream (with the secrets it masks),
plugins, and (once started) the plugin instances chosen **by name** in the config (model,
search provider, reward, loss) with the agent protocol. ``train``, ``smoke``, ``eval``, the
Python API and the offline world's ideal agent all build theirs here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.assets import cache_dir
from searchr1.core.checkpoint import checkpoints_dir, latest_checkpoint
from searchr1.core.config_schema import Config
from searchr1.core.config_validate import advice, plugin_problems
from searchr1.core.disk import (
    as_disk_error,
    describe_refusal,
    hold_folder,
    is_disk_error,
    resume_command,
)
from searchr1.core.distributed import World
from searchr1.core.errors import ConfigError, DiskError, PluginError, SearchR1Error, UserError
from searchr1.core.logs import DISCARD, GroupsDone, RunLog, get_logger, setup_logging, warn
from searchr1.core.plugins import Registry
from searchr1.core.rewards import check_reward, close_reward, create_reward
from searchr1.core.sinks import SinkHub, open_sinks
from searchr1.core.stop import Stop
from searchr1.core.trainer_checks import check_loss, require_trainer
from searchr1.core.types import (
    LossFn,
    Model,
    Question,
    RewardFn,
    Sampler,
    SearchProvider,
    Trainer,
)
from searchr1.rl.job import Environment, Job


@dataclass
class Run:
    """One run: :func:`open_run` gives it a folder and its event stream; :meth:`start` creates
    what the config names (model last: slowest), so a command can check its own inputs in
    between, before the model loads. Without a folder (``run_dir`` None) it is a run of the
    Python API or a script, logging where the process logs.

    A command holds it in a ``with`` block: leaving it closes the event stream, and a write
    the disk refused inside it leaves as the :class:`~searchr1.core.errors.DiskError` that
    names this run's last checkpoint and the command that continues it (:func:`disk_error`)."""

    config: Config
    registry: Registry
    run_dir: Path | None = None
    #: the command that opened it (``train``, ``smoke``, ``eval``; empty outside the CLI's)
    command: str = ""
    #: its events (events.jsonl, the console or JSON lines, its secrets); None: the process's
    log: RunLog | None = None
    #: the ``[log] sinks`` (``train`` only) the loop sends its numbers to
    sinks: SinkHub = field(default_factory=SinkHub)
    #: the torchrun job this process is part of (one process: rank 0 of 1)
    world: World = field(default_factory=World)
    #: SIGINT/SIGTERM for the command (installed by the CLI command; every phase checks it)
    stop: Stop = field(default_factory=Stop)
    model: Model = field(init=False)
    search: SearchProvider = field(init=False)
    reward: RewardFn = field(init=False)
    #: ``train.loss_fn``; None unless started with ``need_loss``
    loss: LossFn | None = field(init=False, default=None)
    #: the descriptor whose flock keeps a second ``train`` out of the folder
    #: (:func:`~searchr1.core.disk.hold_folder`)
    held: int | None = field(init=False, default=None, repr=False)

    @property
    def folder(self) -> Path:
        """The run folder (a run opened by :func:`open_run` always has one)."""
        if self.run_dir is None:
            raise RuntimeError("this run has no folder: open it with open_run")
        return self.run_dir

    @cached_property
    def protocol(self) -> AgentProtocol:
        """The ``[rollout] protocol`` bound to the model's tokenizer, made at first use (a
        chat template whose tool-call format is unknown is a ConfigError then)."""
        from searchr1.core.protocols import make_protocol

        return make_protocol(self.config, self.sampler.tokenizer, self.registry)

    @property
    def sampler(self) -> Sampler:
        return self.model.sampler

    @property
    def env(self) -> Environment:
        """What the algorithm rolls out in (once started): the run's sampler, search,
        protocol, reward and config."""
        return Environment(self.sampler, self.search, self.protocol, self.reward, self.config)

    @property
    def job(self) -> Job:
        """The processes running the algorithm and their stop; its warnings go to the run's
        events and the terminal, its progress to ``progress`` events."""
        return Job(self.world, self.stop, warn, GroupsDone)

    @property
    def trainer(self) -> Trainer:
        """The model's trainer (``start(need_loss=True)`` refuses a model without one,
        naming the provider)."""
        if self.model.trainer is None:
            raise ConfigError(["model.provider: the model only samples; training needs a trainer"])
        return self.model.trainer

    async def start(
        self,
        *,
        need_loss: bool = False,
        search: SearchProvider | None = None,
        check: Question | None = None,
    ) -> Run:
        """Create the search provider (or use ``search``, left open for the caller), reward,
        loss (``need_loss``) and model, then await the model's ``connect`` in the running
        event loop (the command's one loop, which later calls and :meth:`aclose` use too).
        With ``need_loss``, a model without a trainer, or a loss its trainer cannot train, is
        refused before any rollout (:func:`~searchr1.core.trainer_checks.require_trainer`).
        With ``check`` (a question), a reward with a service of its own (the LLM judge) is
        asked it once before the model loads (:func:`~searchr1.core.rewards.check_reward`),
        so a judge that is down or rejects its key stops the command at once with its
        :class:`~searchr1.core.errors.RemoteError`. On any failure what was opened is closed.
        A stop signal interrupts the loads where they are, and the check and the connect at
        their next ``await`` (nothing to keep yet)."""
        cfg, reg = self.config, self.registry
        phase = f"the model load ({cfg.model.base_model or cfg.model.provider})"
        try:
            with self.stop.at_once(phase):
                self.search = search or reg.create("search_provider", cfg.search.provider, cfg)
                self.reward = create_reward(cfg, reg)
            if check is not None:
                await self.stop.cut(check_reward(self.reward, check), "the reward's check")
            with self.stop.at_once(phase):
                self._create(need_loss=need_loss)
            try:
                if self.loss is not None:
                    trainer = require_trainer(self.model, cfg.model.provider)
                    check_loss(
                        trainer.capabilities,
                        self.loss,
                        field="train.loss_fn",
                        provider=cfg.model.provider,
                    )
                if self.model.connect is not None:
                    await self.stop.cut(self.model.connect(), phase)
            except BaseException:
                await self.model.aclose()
                raise
        except BaseException:
            # The search provider and the reward may hold connections; a failed start must
            # not leak them.
            if search is None and hasattr(self, "search"):
                await self.search.aclose()
            if hasattr(self, "reward"):
                await close_reward(self.reward)
            raise
        return self

    def _create(self, *, need_loss: bool) -> None:
        cfg, reg = self.config, self.registry
        if need_loss:
            self.loss = reg.create("loss_fn", cfg.train.loss_fn, cfg)
        self.model = reg.create("model_provider", cfg.model.provider, cfg)
        if not isinstance(self.model, Model):  # the factory's return type, not an ability
            raise PluginError(
                f"model.provider = {cfg.model.provider!r}: its factory returned a "
                f"{type(self.model).__name__}, not a searchr1.core.types.Model(sampler=..., "
                f"trainer=...); see docs/plugins.md"
            )

    async def aclose(self) -> None:
        """Release the model, in the event loop it was started in (the search provider is
        closed there too, by its owner: ``await run.search.aclose()``). The event stream
        stays open for the command's last events (``train_done``, eval's summary) until
        :meth:`close`."""
        await self.model.aclose()

    def close(self) -> None:
        """Close the run's event stream (its console and events file; later events of the
        process go to stderr) and let go of the folder (``held``)."""
        if self.log is not None:
            self.log.close()
        if self.held is not None:
            os.close(self.held)  # releases the flock
            self.held = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, _kind: Any, exc: BaseException | None, _tb: Any) -> None:
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        """Close the run; ``exc``, a write the disk refused, leaves as this run's
        :func:`disk_error`."""
        self.close()
        if isinstance(exc, Exception) and not isinstance(exc, SearchR1Error):
            refused = as_disk_error(exc)
            if refused is not None:
                raise disk_error(refused, self.run_dir, self.command, self.config.source) from exc


def open_run(
    config: Config,
    command: str,
    *,
    registry: Registry,
    run_dir: str | None = None,
    resume: bool = False,
    world: World | None = None,
    stop: Stop | None = None,
    **log_kwargs: Any,
) -> Run:
    """Choose the run folder and start logging into it, with ``registry``'s plugins (the
    command's, loaded by its entry point). Plugin names are resolved before the folder is created;
    :meth:`Run.start` creates the plugins. Under torchrun (``world``) rank 0 chooses the
    folder and alone writes events.jsonl and the sinks; rank ``r`` logs to
    ``ranks/rank<r>.jsonl`` there. ``stop``: the command's installed :class:`Stop` (None:
    one that no signal sets). The command holds the run in a ``with`` block (:class:`Run`)."""
    world = world or World()
    if problems := plugin_problems(config, registry):  # a typo is named before any plugin starts
        raise ConfigError(problems)
    chosen, held = _claim_run_dir(config, command, run_dir=run_dir, resume=resume, world=world)
    run = Run(config, registry, chosen, command=command, world=world, stop=stop or Stop())
    run.held = held
    if command == "train":
        log_kwargs.setdefault("total_steps", config.train.max_steps)
    try:
        run.log, run.sinks = _start_logging(config, registry, command, world, chosen, log_kwargs)
    except BaseException as exc:  # an events file the disk refuses names the run's checkpoint
        run._end(exc)
        raise
    return run


def _claim_run_dir(
    config: Config, command: str, *, run_dir: str | None, resume: bool, world: World
) -> tuple[Path, int | None]:
    """The run folder rank 0 chose (every rank gets it, or rank 0's refusal), and the hold
    on it of a ``train`` (one process trains a folder at a time)."""
    chosen: Path | str | None = None
    held: int | None = None
    if world.main:
        try:
            chosen = _choose_run_dir(config, command, given=run_dir, resume=resume)
            if command == "train":
                held = hold_folder(chosen, "trained", "continue with --resume")
        except UserError as exc:
            world.broadcast(str(exc))  # the other ranks stop with the same message
            raise
    chosen = world.broadcast(chosen)
    if isinstance(chosen, str):
        raise UserError(chosen)
    assert chosen is not None
    return chosen, held


def _start_logging(
    config: Config,
    registry: Registry,
    command: str,
    world: World,
    folder: Path,
    log_kwargs: dict[str, Any],
) -> tuple[RunLog, SinkHub]:
    """Log into the run ``folder`` (rank ``r`` > 0: ``ranks/rank<r>.jsonl``, nothing on
    screen), open the metric sinks of a train, and log ``run_start`` and the config's
    choices; the run's event stream and sinks."""
    events = folder / "events.jsonl"
    if not world.main:
        (folder / "ranks").mkdir(exist_ok=True)
        events = folder / "ranks" / f"rank{world.rank}.jsonl"
        log_kwargs["stream"] = DISCARD
        log_kwargs.pop("screen", None)
    log = setup_logging(folder.name, events, secrets=config.secrets, **log_kwargs)
    try:
        # metric sinks: [log] sinks (events.jsonl is always on)
        main_train = command == "train" and world.main
        sinks = open_sinks(config, registry, folder) if main_train else SinkHub()
        get_logger().info(
            "run_start",
            command=command,
            run_dir=str(folder),
            config_source=config.source,
            **({"world_size": world.size, "rank": world.rank} if world.size > 1 else {}),
        )
        if world.main:
            announce_config(config, registry, log)
    except BaseException:
        log.close()
        raise
    return log, sinks


def announce_config(config: Config, registry: Registry, log: RunLog) -> None:
    """Log (``config_choice``, ``config_warning``) and say (``warning: ...``) what the run
    should know: inferred provider/protocol, literal secrets, empty exported variables, plugin
    advice (:func:`searchr1.core.config_validate.advice`), on the run's stream ``log``. On a
    terminal the console draws the events, so they are said once."""
    events = get_logger()
    drawn = log.on_screen()
    for dotted, reason in config.choices.items():
        if reason.startswith("not set"):
            section, key = dotted.split(".", 1)
            value = getattr(getattr(config, section), key)
            events.info("config_choice", field=dotted, value=value, reason=reason)
            if not drawn:
                log.say(f"{dotted} = {value!r}: {reason}")
    for line in [*config.warnings, *advice(config, registry)]:
        events.warning("config_warning", detail=line)
        if not drawn:
            log.say(f"warning: {line}")


def _choose_run_dir(config: Config, command: str, *, given: str | None, resume: bool) -> Path:
    """The run folder (created): ``--run-dir``, else on ``--resume`` the ``run.name`` run
    or the latest ``<command>-*`` one, else a new one (``run.name`` or a timestamp). Nothing
    to resume, or a file path, is a UserError naming the flag or field (exit code 2)."""
    run_dir, origin = _run_dir_asked(config, command, given=given, resume=resume)
    if resume and not run_dir.is_dir():
        raise UserError(
            f"--resume: nothing to resume: {str(run_dir)!r} ({origin}) does not exist. Leave "
            f"out --resume to start a new run there."
        )
    _make_run_dir(run_dir, origin)
    for name, holds in _RUN_FOLDERS.get(command, {}).items():
        # found now, not when the first save fails after a step's work
        if (folder := run_dir / name).exists() and not folder.is_dir():
            raise UserError(
                f"{origin}: {str(folder)!r} is a file, but {command} keeps its {holds} "
                f"in that folder; move the file away, or give another run folder"
            )
    if command == "train" and not resume:
        saved = sorted(p.name for p in checkpoints_dir(run_dir).glob("step_*") if p.is_dir())
        if saved:  # a fresh run's checkpoints would sit among the old run's, and --resume mix them
            raise UserError(
                f"{origin}: {str(run_dir)!r} already holds a train run (checkpoints up to "
                f"{saved[-1]}); continue it with --resume, or give another folder (--run-dir, or "
                f"another run.name) for a new run"
            )
    return run_dir


def _run_dir_asked(
    config: Config, command: str, *, given: str | None, resume: bool
) -> tuple[Path, str]:
    """The folder the flags and config ask for, and the origin an error names (a new folder
    is made here; another command's ``--run-dir`` or nothing to resume is refused)."""
    parent = Path(config.run.dir)
    if given:
        run_dir, origin = Path(given), f"--run-dir {given}"
        other = run_command(run_dir)
        if other is not None and other != command:
            # its events.jsonl would interleave two commands' events (a report, a resume
            # and the metric readers take the folder for one run)
            raise UserError(
                f"{origin}: {str(run_dir)!r} holds a `searchr1 {other}` run (its events.jsonl "
                f"says so); {command} would add its own events and files to it. Give a new "
                f"folder, or leave out --run-dir for a new {command}-* folder in "
                f"{str(parent)!r} (run.dir)"
            )
        return run_dir, origin
    if resume and config.run.name:
        return parent / config.run.name, f"run.name = {config.run.name!r}"
    if resume:
        # the most recently modified <command>-* run folder
        runs = sorted(parent.glob(f"{command}-*"), key=lambda p: p.stat().st_mtime)
        if not runs:
            raise UserError(
                f"--resume: nothing to resume: no earlier {command}-* run folder in "
                f"{str(parent)!r} (run.dir). Leave out --resume to start a new run, or name "
                f"the run to continue with --run-dir."
            )
        return runs[-1], f"run.dir = {str(parent)!r}"
    if config.run.name:
        return parent / config.run.name, f"run.dir = {str(parent)!r}"
    return _new_folder(parent, f"{command}-{time.strftime('%Y%m%d-%H%M%S')}")


def _make_run_dir(run_dir: Path, origin: str) -> None:
    """Create ``run_dir``; a path that cannot be a folder is a UserError (a full or
    read-only disk stays the CLI's disk error)."""
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


def _new_folder(parent: Path, name: str) -> tuple[Path, str]:
    """A run folder of ``parent`` that no other command has: ``name``, else ``name-2``, ...
    (two commands started in the same second), made here so that no other process takes it
    too; and the origin an error names."""
    origin = f"run.dir = {str(parent)!r}"
    for n in range(1, 1000):
        folder = parent / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        except (OSError, ValueError):  # what it is (a file in the path, NUL) the caller says
            return folder, origin
        return folder, origin
    return parent / name, origin


#: command -> the sub-folders its run writes, and what they hold
_RUN_FOLDERS = {"train": {"checkpoints": "checkpoints", "trajectories": "trajectory dumps"}}


def run_command(folder: Path) -> str | None:
    """The command whose run ``folder`` holds (its events.jsonl's ``run_start``), or None:
    not a run folder, or a log too damaged to say."""
    import json

    try:
        with (folder / "events.jsonl").open(encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(100), fh, strict=False):  # run_start comes first
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "run_start":
                    command = event.get("command")
                    return command if isinstance(command, str) else None
    except OSError:
        return None
    return None


def disk_error(
    exc: OSError, folder: Path | None = None, command: str = "", source: str = ""
) -> DiskError:
    """The one message for a write the disk refused (:mod:`searchr1.core.disk`): the path,
    the free space there, the last complete checkpoint of the run in ``folder`` and the
    command that continues it (a ``train`` of the config ``source``; outside ``train`` or any
    run, to run the command again)."""
    lines, advice = describe_refusal(exc, folder)
    if exc.filename and _is_under(Path(exc.filename), cache_dir()):
        advice += " (the cache folder is $SEARCHR1_CACHE, default ~/.cache/searchr1)"
    if folder is not None and command == "train":
        last = latest_checkpoint(folder)
        if last is not None:
            lines.append(f"last complete checkpoint: {last.path} (step {last.step})")
            lines.append(f"{advice}, then continue the run with:")
            lines.append(f"  {resume_command(folder, source)}")
        else:
            lines.append(f"no complete checkpoint yet in {folder}")
            lines.append(f"{advice}, then start the run again")
    else:
        lines.append(f"{advice}, then run the command again")
    return DiskError("\n".join(lines))


def _is_under(path: Path, folder: Path) -> bool:
    try:
        return path.absolute().is_relative_to(folder.absolute())
    except (OSError, ValueError):
        return False
