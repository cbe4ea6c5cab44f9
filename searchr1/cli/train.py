"""``searchr1 train``: open a run folder and run the training loop in it.

The loop itself is :func:`searchr1.core.train.train`; this command opens the run
(:func:`searchr1.cli.args.open_run_from_args`: config, plugins, logging, ``--resume``) and turns the
loop's ways of stopping early into what a shell expects: the search environment down
(exit 3, with the reason), a health alert with ``[train.health] on_alert = "stop"`` (exit 5,
naming the alert, after a checkpoint) and SIGINT/SIGTERM in any phase (exit 130/143, saying
what was kept and the command that continues: the command's :class:`~searchr1.core.stop.Stop`).
The exit codes come from the error classes (:mod:`searchr1.core.errors`).

Under torchrun (``torchrun --nproc-per-node N -m searchr1 train ...``) each process joins the
job (:mod:`searchr1.core.distributed`); ``--nproc N`` starts that torchrun on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys

from searchr1.cli.args import add_run_args, whole_number
from searchr1.core.checkpoint import latest_checkpoint
from searchr1.core.disk import resume_command
from searchr1.core.distributed import RankLost, World
from searchr1.core.errors import EnvironmentDown, HealthStop, Interrupted
from searchr1.core.stop import Stop


def main(args: argparse.Namespace) -> int:
    nproc = getattr(args, "nproc", None)
    if nproc is not None and "WORLD_SIZE" not in os.environ:
        return _launch(nproc)
    world = World.from_env()
    # torchrun passes a terminal's Ctrl-C on to its workers a second time: not "at once" there
    try:
        with Stop(second_exits=world.size == 1).installed() as stop:
            return _train(args, world, stop)
    finally:
        world.close()


def _train(args: argparse.Namespace, world: World, stop: Stop) -> int:
    from searchr1.cli.args import open_run_from_args
    from searchr1.core.logs import get_logger
    from searchr1.core.train import train

    run = open_run_from_args(args, "train", world=world, stop=stop)
    try:
        train(run, resume=bool(getattr(args, "resume", False)))
    except EnvironmentDown as exc:
        get_logger().error("train_stopped", reason=str(exc))
        if world.main:  # every rank stops alike; one says so
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
    except Interrupted as stopped:
        if world.main:  # the CLI prints what was kept and the command that continues
            raise
        return stopped.exit_code
    except RankLost as exc:  # say where the run can continue from
        last = latest_checkpoint(run.folder)
        if last is None:
            raise RankLost(
                f"{exc}\nno complete checkpoint yet in {run.folder}: start the run again"
            ) from None
        raise RankLost(
            f"{exc}\nlast complete checkpoint: {last.path} (step {last.step}); continue with "
            f"`{resume_command(run.folder, run.config.source)}` (any number of processes)"
        ) from None
    return 0


def _launch(nproc: int) -> int:
    """Run this same command under ``torchrun --standalone --nproc-per-node nproc`` (one
    machine; several machines: run torchrun yourself, README "More than one GPU")."""
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            argv.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(nproc), "-m", "searchr1", *argv]
    print("searchr1: starting " + " ".join(command[1:]), file=sys.stderr, flush=True)
    os.execv(sys.executable, command)
    return 0  # not reached


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="run the Search-R1 training loop")
    add_run_args(p)
    p.add_argument(
        "--nproc",
        type=whole_number(1),
        help="data-parallel processes on this machine (starts torchrun --standalone; one per "
        "GPU); under torchrun already, ignored",
    )
    p.set_defaults(func=main)
