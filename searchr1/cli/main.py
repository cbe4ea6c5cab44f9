"""The ``searchr1`` command line.

:func:`main` builds the parser from each command module's ``add_parser``, says which config
the command runs, and hands over to the command. Every
:class:`~searchr1.core.errors.SearchR1Error` prints as a plain message on stderr, never a
traceback, and the command exits with its class's ``exit_code`` (README, "Exit codes").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from searchr1.cli import config_check, data, plugins, report, serve_retriever, smoke, train
from searchr1.cli import eval as eval_command
from searchr1.cli import index as index_command
from searchr1.core.distributed import report_stop, speaks_for_job
from searchr1.core.errors import Interrupted, SearchR1Error
from searchr1.core.logs import say
from searchr1.defaults import default_config_path

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.plugins import Registry

#: The commands in the order ``searchr1 --help`` lists them.
COMMANDS = (train, smoke, plugins, config_check, eval_command, report, data)
COMMANDS += (index_command, serve_retriever)  # dense retrieval (plugins/dense_search)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="searchr1", description="Train LLM search agents with reinforcement learning."
    )
    parser.add_argument("--version", action="version", version=f"searchr1 {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def package_version() -> str:
    """The installed distribution's version (``unknown`` when run from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("searchr1")
    except PackageNotFoundError:
        return "unknown"


#: the exit code of a command whose reader closed its output, as a shell reports a tool that
#: SIGPIPE ended (128 + 13)
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None, registry: Registry | None = None) -> int:
    """Run ``searchr1 ARGV``; returns the exit code. ``registry``: the plugins the command
    runs with (a test passes one holding its own plugins); None: the command loads the
    installed ones."""
    try:
        code = _run_command(argv, registry)
        sys.stdout.flush()  # a pipe closed early fails here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        # stdout goes to /dev/null so the interpreter's own flush at exit fails no more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _run_command(argv: Sequence[str] | None, registry: Registry | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2) or --help (0), already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    args.registry = registry
    _progress_bars_only_on_a_terminal()
    from searchr1.core.logs import log_to_stderr

    log_to_stderr()  # until the command opens its run (which logs where its events go)
    if hasattr(args, "config"):
        if args.config is None:
            args.config, args.config_reason = default_config_path()
        else:
            args.config_reason = "--config"
        # a command may leave it to another process or its own header: announce_config is
        # False (config check) or a function of the arguments (train's --nproc launcher)
        announce = getattr(args, "announce_config", True)
        if (announce(args) if callable(announce) else announce) and speaks_for_job():
            say(f"config: {args.config or '<embedded offline default>'} ({args.config_reason})")
    try:
        try:
            return int(args.func(args) or 0)
        except Exception as exc:  # a disk that refused a write outside the command's run
            from searchr1.core.disk import as_disk_error
            from searchr1.core.runs import disk_error

            refused = as_disk_error(exc) if not isinstance(exc, SearchR1Error) else None
            if refused is None:
                raise
            raise disk_error(refused) from exc
    except SearchR1Error as exc:  # the class says the exit code (searchr1.core.errors)
        from searchr1.core.secrets import redact_text

        text = redact_text(str(exc))  # a message may quote a value holding a key
        if isinstance(exc, Interrupted):  # a stop, not an error: what it kept, how to go on
            report_stop(f"searchr1: {text}")
        else:
            report_stop(f"searchr1: error:\n{text}" if "\n" in text else f"searchr1: error: {text}")
        return exc.exit_code
    except KeyboardInterrupt:
        report_stop("searchr1: interrupted")
        return 130


#: read by huggingface_hub when imported (and through it by transformers), and inherited by
#: the processes of a torchrun job
_NO_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"


def _progress_bars_only_on_a_terminal() -> None:
    """Libraries' progress bars go to stderr: off unless it is a terminal and this process
    speaks for the job (one bar, not one per rank). An explicit ``HF_HUB_DISABLE_PROGRESS_BARS``
    wins."""
    if sys.stderr.isatty() and speaks_for_job():
        return
    if os.environ.setdefault(_NO_BARS, "1") != "1":
        return
    # a library imported already (a command run in-process) has read the variable
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
