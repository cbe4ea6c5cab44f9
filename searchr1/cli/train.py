"""``searchr1 train``: open a run folder and run the training loop in it.

The loop itself is :func:`searchr1.core.train.train`; this command opens the run
(:func:`searchr1.cli.args.open_run_from_args`: config, plugins, logging, ``--resume``) and turns the
loop's ways of stopping early into what a shell expects: the search environment down
(exit 3, with the reason), a health alert with ``[train.health] on_alert = "stop"`` (exit 5,
naming the alert, after a checkpoint) and SIGINT/SIGTERM in any phase (exit 130/143, saying
what was kept and the command that continues: the command's :class:`~searchr1.core.stop.Stop`).
The exit codes come from the error classes (:mod:`searchr1.core.errors`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from searchr1.cli.args import add_run_args, whole_number
from searchr1.core.disk import resume_command
from searchr1.core.distributed import RankLost, World
from searchr1.core.errors import EnvironmentDown, HealthStop, Interrupted, RemoteError
from searchr1.core.logs import say
from searchr1.core.stop import Stop


def main(args: argparse.Namespace) -> int:
    if _launches(args):
        return _launch(args.nproc)
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
    from searchr1.core.plugins import load_registry
    from searchr1.core.train import kept, train

    registry = getattr(args, "registry", None) or load_registry()
    run = open_run_from_args(args, "train", registry=registry, world=world, stop=stop)
    with run:  # closes its event stream; a refused write names its checkpoint
        try:
            train(run, resume=bool(getattr(args, "resume", False)))
        except EnvironmentDown as exc:
            get_logger().error("train_stopped", reason=str(exc), exit_code=exc.exit_code)
            if world.main:  # every rank stops alike; one says so
                say(f"searchr1: training stopped: {exc}")
            return exc.exit_code
        except RemoteError as exc:  # a remote channel failed for good (the judge's check...)
            get_logger().error(
                "train_stopped", reason=str(exc), failure=exc.failure, exit_code=exc.exit_code
            )
            raise
        except HealthStop as exc:
            get_logger().error(
                "train_stopped",
                reason=str(exc),
                alert=exc.kind,
                step=exc.step,
                exit_code=exc.exit_code,
            )
            if world.main:
                say(
                    f"searchr1: training stopped: {exc}; continue anyway with "
                    f"`{resume_command(run.folder, run.config.source)}` after raising the "
                    f'threshold or setting on_alert = "warn"'
                )
            return exc.exit_code
        except Interrupted as stopped:
            if world.main:  # the CLI prints what was kept and the command that continues
                raise
            return stopped.exit_code
        except RankLost as exc:  # say where the run can continue from (unless the loop did)
            if "\nkept: " in str(exc):
                raise
            said, then = kept(run.folder, run.config.source)
            raise RankLost(f"{exc}\nkept: {said}\n{then} (any number of processes)") from None
        return 0


def _launches(args: argparse.Namespace) -> bool:
    """Whether this process starts the job (``--nproc`` outside torchrun) rather than running
    the loop; rank 0 of the job then says the config it runs."""
    return getattr(args, "nproc", None) is not None and "WORLD_SIZE" not in os.environ


def _launch(nproc: int) -> int:
    """Run this same command as ``torchrun --standalone --nproc-per-node nproc`` (one machine;
    several machines: run torchrun yourself, docs/scale-out.md), torchrun's launcher
    in this process, and return the job's exit code: 0; the first failing rank's (a signal
    that ended it: 128 + its number), after its message unless rank 0 already said it; 130
    or 143 for a SIGINT/SIGTERM that torchrun forwarded to the ranks (rank 0 says what was
    kept). torchrun's own log lines and its ``ChildFailedError`` report stay unsaid."""
    import logging

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            argv.append(arg)
    command = ["--standalone", "--nproc-per-node", str(nproc), "-m", "searchr1", *argv]
    say("searchr1: starting torchrun " + " ".join(command))
    # torchrun's log lines in this process (not the ranks'): the outcome is said below. Its
    # loggers set levels of their own and print through torch.distributed's handler.
    torch_logs = logging.getLogger("torch.distributed")
    for handler in torch_logs.handlers:
        handler.setLevel(logging.CRITICAL + 1)
    torch_logs.addHandler(logging.NullHandler())  # nor Python's last-resort handler
    torch_logs.propagate = False
    try:
        torchrun.run(torchrun.parse_args(command))
    except SignalException as exc:  # forwarded to every rank, which stopped (or was killed)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        return _job_failed(exc)
    return 0


def _job_failed(exc: Any) -> int:
    """Say why the job failed unless rank 0 did (its message in its torchelastic error file),
    and return the first failing rank's exit code (128 + the signal that killed it)."""
    rank, first = exc.get_first_failure()
    said = {r: _said(f) for r, f in exc.failures.items()}
    if rank != 0 and said[rank] is not None and said[rank] != said.get(0):
        print(said[rank], file=sys.stderr, flush=True)  # rank 0 did not say the same
    elif said[rank] is None:  # killed, or a crash that printed its own traceback
        how = (
            f"was killed by {first.signal_name()}"
            if first.exitcode < 0
            else f"exited with code {first.exitcode}"
        )
        print(
            f"searchr1: error: rank {rank} of the torchrun job (pid {first.pid}) {how}",
            file=sys.stderr,
            flush=True,
        )
    return 128 - first.exitcode if first.exitcode < 0 else first.exitcode


def _said(failure: Any) -> str | None:
    """The message a rank left in its error file (:func:`searchr1.core.distributed.report_stop`)."""
    message = failure.message
    if isinstance(message, dict) and isinstance(message.get("message"), str):
        return message["message"]
    return None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="run the Search-R1 training loop")
    add_run_args(p)
    p.add_argument(
        "--nproc",
        type=whole_number(1),
        help="data-parallel processes on this machine (starts torchrun --standalone; one per "
        "GPU); under torchrun already, ignored",
    )
    p.set_defaults(func=main, announce_config=lambda args: not _launches(args))
