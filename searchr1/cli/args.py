"""What several commands share: the ``--config`` default and the count flags.

:func:`default_config_path` is also used by :mod:`searchr1.api`, so the Python API runs the
config the command line would.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

CONFIG_HELP = (
    "config.toml (default: $SEARCHR1_CONFIG when that file exists, else ./config.toml when it "
    "exists, else the embedded offline demo)"
)


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for a count flag: a whole number >= ``minimum``, else a usage
    error naming the flag (exit code 2) rather than a value that runs something unintended
    (a negative ``--max-steps``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a whole number >= {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags of a command that opens a run folder (``train``, ``smoke``)."""
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--run-dir", help="folder for this run's logs and checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--max-steps", type=whole_number(0), help="override train.max_steps")


def _config_from_env() -> str | None:
    """``$SEARCHR1_CONFIG`` when it names an existing file, else None (the embedded default).

    The container image sets it to ``/workspace/config.toml``, which exists only when the user
    has a config.toml in the project folder mounted there (compose.yaml): with one, every
    command uses it; without, they run the offline demo. ``--config`` always wins.
    """
    path = os.environ.get("SEARCHR1_CONFIG", "")
    return path if path and os.path.isfile(path) else None


def default_config_path() -> tuple[str | None, str]:
    """The config a command runs when ``--config`` is not given, and why: ``$SEARCHR1_CONFIG``
    when that file exists (the container image), else ``./config.toml`` when it exists (the
    reference setup's layout: config.toml and .env in the project folder), else the demo."""
    from_env = _config_from_env()
    if from_env is not None:
        return from_env, "$SEARCHR1_CONFIG names it and --config was not given"
    if os.path.isfile("config.toml"):
        return "config.toml", "./config.toml exists in the working directory; no --config given"
    return None, "no --config, no $SEARCHR1_CONFIG file and no ./config.toml: the offline demo"
