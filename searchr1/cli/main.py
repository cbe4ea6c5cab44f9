"""The ``searchr1`` command line.

``searchr1 train|smoke|eval|report|plugins|config check|data check``. :func:`main` builds
the parser from each command module's ``add_parser`` (one module per command in
:mod:`searchr1.cli`), says which config the command runs and why, and hands over to the
command. Every :class:`~searchr1.core.errors.SearchR1Error` prints as a plain message, never
as a traceback (a stop by SIGINT/SIGTERM, ``Interrupted``, as what it kept and how to go on),
and the command exits with its class's ``exit_code`` (2 for what the user must
fix: config, plugins, data). A write the filesystem refuses (disk full, over quota, read-only,
an I/O error, no permission) is turned here, in one place, into a
:class:`~searchr1.core.errors.DiskError` (exit code 4) naming the path, the free space, the
last complete checkpoint and the command that continues the run. A reader that closes the
pipe early (``searchr1 plugins | head -1``) ends the command quietly, as it ends other Unix
tools.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from searchr1.cli import config_check, data, plugins, report, serve_retriever, smoke, train
from searchr1.cli import eval as eval_command
from searchr1.cli import index as index_command
from searchr1.core.errors import Interrupted, SearchR1Error
from searchr1.defaults import default_config_path

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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run_command(argv)
        sys.stdout.flush()  # a pipe closed early fails here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        # stdout goes to /dev/null so the interpreter's own flush at exit fails no more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _run_command(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2) or --help (0), already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    if hasattr(args, "config"):
        if args.config is None:
            args.config, args.config_reason = default_config_path()
        else:
            args.config_reason = "--config"
        if getattr(args, "announce_config", True):  # config check says it in its header
            print(f"config: {args.config or '<embedded offline default>'} ({args.config_reason})")
    from searchr1.core.disk import track_run

    track_run(None)  # until the command opens its run folder (open_run)
    try:
        try:
            return int(args.func(args) or 0)
        except Exception as exc:  # a disk that refused a write, however a library wraps it
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
            print(f"searchr1: {text}", file=sys.stderr)
        else:
            print(
                f"searchr1: error:\n{text}" if "\n" in text else f"searchr1: error: {text}",
                file=sys.stderr,
            )
        return exc.exit_code
    except KeyboardInterrupt:
        print("searchr1: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
