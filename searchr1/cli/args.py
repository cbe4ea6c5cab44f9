"""What several commands share: the ``--config`` default and the count flags.

The default ``--config`` is :func:`searchr1.defaults.default_config_path`, shared with the
Python API.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1.core.plugins import Registry
    from searchr1.core.runs import Run
    from searchr1.core.types import Asset

CONFIG_HELP = (
    "config.toml (default: $SEARCHR1_CONFIG when that file exists, else ./config.toml when it "
    "exists, else the embedded offline demo)"
)


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a count flag: a whole number >= ``minimum`` (and <=
    ``maximum`` when given), else a usage error naming the flag (exit code 2) rather than a
    value that runs something unintended (a negative ``--max-steps``)."""
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a whole number {bounds}, got {text!r}"
            ) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def add_run_args(p: argparse.ArgumentParser, *, steps: bool = True) -> None:
    """The flags of a command that opens a run folder (``train``, ``smoke``); ``steps``:
    ``--resume`` and ``--max-steps`` too (a command that takes training steps)."""
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--run-dir", help="folder for this run's logs and checkpoints")
    if steps:
        p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
        p.add_argument("--max-steps", type=whole_number(0), help="override train.max_steps")
    add_no_cache_arg(p)


def add_no_cache_arg(p: argparse.ArgumentParser) -> None:
    """``--no-cache``: the command's search asks the service for every query."""
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="ask the search service again for every query: no answers from earlier runs, "
        "none kept for later ones (search.disk_cache = false)",
    )


def command_assets(args: argparse.Namespace, spec: str) -> Mapping[str, Asset]:
    """The ``builtin:`` assets a command without a config resolves ``spec`` against: its
    registry's (``args.registry``, else the installed plugins, loaded here) when ``spec`` is
    ``builtin:``; none otherwise, so a plain file is read without loading any plugin."""
    from searchr1.core.assets import is_builtin
    from searchr1.core.plugins import load_registry

    registry = getattr(args, "registry", None)
    if registry is None and is_builtin(spec):
        registry = load_registry()
    return registry.assets if registry is not None else {}


def open_run_from_args(
    args: argparse.Namespace,
    command: str,
    *,
    registry: Registry,
    config: Any = None,
    **log_kwargs: Any,
) -> Run:
    """:func:`searchr1.core.runs.open_run` for a parsed command line, with the command's
    plugins ``registry``: the config of ``--config`` (or ``config``, already loaded),
    ``--max-steps`` and ``--no-cache`` applied, ``--run-dir`` and ``--resume`` passed on, and
    the terminal console when stdout is a TTY."""
    from functools import partial

    from searchr1.cli.console import intro_lines, tty_screen
    from searchr1.core.config import load_config
    from searchr1.core.runs import open_run

    config = config or load_config(
        getattr(args, "config", None), registry=registry, check_plugins=True
    )
    max_steps = getattr(args, "max_steps", None)
    if max_steps is not None:
        flags = {**config.flags, "train.max_steps": "--max-steps"}
        config = config.replace(train={"max_steps": max_steps}, flags=flags)
    if getattr(args, "no_cache", False):
        config = config.replace(search={"disk_cache": False})
    intro = partial(intro_lines, config) if command == "train" else None
    log_kwargs.setdefault("screen", tty_screen(intro=intro))
    return open_run(
        config,
        command,
        run_dir=getattr(args, "run_dir", None),
        resume=bool(getattr(args, "resume", False)),
        registry=registry,
        **log_kwargs,
    )
