"""``searchr1 train``: open a run folder and run the training loop in it.

The loop itself is :func:`searchr1.core.train.train`; this command opens the run
(:func:`searchr1.cli.args.open_run_from_args`: config, plugins, logging, ``--resume``) and turns the
loop's ways of stopping early into what a shell expects: the search environment down
(exit 3, with the reason), a health alert with ``[train.health] on_alert = "stop"`` (exit 5,
naming the alert, after a checkpoint) and SIGINT/SIGTERM after a checkpoint (exit 130/143,
with the ``--resume`` command that continues). Both exit codes come from the error classes
(:mod:`searchr1.core.errors`).
"""

from __future__ import annotations

import argparse
import sys

from searchr1.cli.args import add_run_args
from searchr1.core.disk import resume_command
from searchr1.core.errors import EnvironmentDown, HealthStop, Interrupted


def main(args: argparse.Namespace) -> int:
    from searchr1.cli.args import open_run_from_args
    from searchr1.core.logs import get_logger
    from searchr1.core.train import train

    run = open_run_from_args(args, "train")
    try:
        train(run, resume=bool(getattr(args, "resume", False)))
    except EnvironmentDown as exc:
        get_logger().error("train_stopped", reason=str(exc))
        print(f"searchr1: training stopped: {exc}")
        return exc.exit_code
    except HealthStop as exc:
        get_logger().error("train_stopped", reason=str(exc), alert=exc.kind, step=exc.step)
        print(
            f"searchr1: training stopped: {exc}; continue anyway with "
            f"`{resume_command(run.folder, run.config.source)}` after raising the threshold "
            f'or setting on_alert = "warn"',
            file=sys.stderr,
        )
        return exc.exit_code
    except Interrupted as stop:
        where = f"checkpoint step {stop.step} saved" if stop.saved else "no new step to save"
        print(
            f"searchr1: stopped by {stop} after step {stop.step} ({where}); continue with "
            f"`{resume_command(run.folder, run.config.source)}`",
            file=sys.stderr,
        )
        return stop.exit_code
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="run the Search-R1 training loop")
    add_run_args(p)
    p.set_defaults(func=main)
