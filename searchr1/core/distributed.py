"""Data-parallel training under torchrun: the processes of one job and what they share.

``torchrun --nproc-per-node N -m searchr1 train`` (or ``searchr1 train --nproc N``) starts N
copies of the loop; :meth:`World.from_env` reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and
joins them (gloo on CPU, nccl on CUDA, each rank on ``cuda:LOCAL_RANK``). What each rank
does in a step, and why the update equals one process's: docs/scale-out.md.
"""

from __future__ import annotations

import builtins
import datetime
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from searchr1.core.errors import ConfigError, SearchR1Error
from searchr1.core.old_imports import warn_plugins

T = TypeVar("T")

#: How long a collective waits for the slowest rank: rank 0 alone runs the held-out evals
#: while the others wait in the next step's first gather.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


class RankLost(SearchR1Error):
    """Another process of the torchrun job stopped (crashed, killed, out of memory), so
    this one cannot go on; its own output says why (exit code 1)."""


@dataclass(frozen=True)
class World:
    """This process's place in the job: ``rank`` of ``size`` (one process: 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        """The world torchrun describes in ``env`` (default ``os.environ``), joined; without
        ``WORLD_SIZE`` (or with 1) a one-process world that starts nothing."""
        env = os.environ if env is None else env
        try:
            size = int(env.get("WORLD_SIZE", "1"))
            rank = int(env.get("RANK", "0"))
            local_rank = int(env.get("LOCAL_RANK", "0"))
        except ValueError:
            raise ConfigError(
                [
                    "RANK / WORLD_SIZE / LOCAL_RANK must be integers (torchrun sets them); got "
                    f"{env.get('RANK')!r} / {env.get('WORLD_SIZE')!r} / {env.get('LOCAL_RANK')!r}"
                ]
            ) from None
        if size <= 1:
            return cls()
        if not 0 <= rank < size:
            raise ConfigError([f"RANK = {rank} is outside 0..{size - 1} (WORLD_SIZE = {size})"])
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "gloo"
            if torch.cuda.is_available():
                torch.cuda.set_device(local_rank)
                backend = "nccl"
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        return cls(rank=rank, size=size, local_rank=local_rank)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes the run folder."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share of ``items`` (sizes differ by at most one; rank
        ``r``'s share precedes rank ``r + 1``'s, so gathering restores the order)."""
        n = len(items)
        return list(items[self.rank * n // self.size : (self.rank + 1) * n // self.size])

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        collective(dist.all_gather_object, out, obj, size=self.size)
        return out

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (every rank gets the same answer)."""
        if self.size == 1:
            return bool(flag)
        return builtins.any(self.gather(bool(flag)))

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box: list[Any] = [obj]
        collective(dist.broadcast_object_list, box, 0, size=self.size)
        return box[0]

    def close(self) -> None:
        """Leave the job (end of the command)."""
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def speaks_for_job(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process says what the job does and why it stopped: a lone process, or
    rank 0 of a torchrun job (``RANK``, set before :meth:`World.from_env` joins)."""
    env = os.environ if env is None else env
    return env.get("RANK", "0") == "0" or env.get("WORLD_SIZE", "1") == "1"


def report_stop(message: str) -> None:
    """Say ``message``, why this process stops (an error, an interrupt), once per job: on
    stderr from the process that :func:`speaks_for_job`. Under torchrun every rank then also
    writes it to its torchelastic error file (``TORCHELASTIC_ERROR_FILE``, in the format of
    torch's ``ErrorHandler``, without a traceback), where the launcher finds the message of
    the rank that failed first; a rank > 0 without such a file prints it, naming its rank."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if speaks_for_job():  # said before it is filed: a rank killed in between said it
        print(message, file=sys.stderr, flush=True)
    if path:
        info = {"timestamp": str(int(time.time()))}
        try:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"message": {"message": message, "extraInfo": info}}, fh)
            return
        except OSError:
            pass
    if not speaks_for_job():
        print(f"[rank {os.environ.get('RANK')}] {message}", file=sys.stderr, flush=True)


def all_reduce_grads(params: Sequence[Any]) -> None:
    """Sum ``params``' gradients over the ranks of the default process group (nothing
    without one). A parameter no rank has a gradient for keeps ``grad = None``, as in one
    process (the optimizer skips it); one that some ranks lack gets their zeros."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or not params:
        return
    size = dist.get_world_size()
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    collective(dist.all_reduce, has, size=size)
    for dtype in {p.dtype for p in params}:
        group = [(i, p) for i, p in enumerate(params) if p.dtype == dtype and has[i] > 0]
        if not group:
            continue
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for _, p in group]
        )
        collective(dist.all_reduce, flat, size=size)
        offset = 0
        for _, p in group:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n


def check_supported(
    world: World, *, max_staleness: int, data_parallel: bool | None, provider: str
) -> None:
    """Refuse what this job cannot do with more than one rank, naming the setting
    (``data_parallel`` None: the trainer is not created yet, not checked)."""
    if world.size == 1:
        return
    problems = []
    if max_staleness > 0:
        problems.append(
            f"train.max_staleness = {max_staleness}: pipelined rollouts are not supported "
            f"under torchrun (WORLD_SIZE = {world.size}); set it to 0, or run one process"
        )
    if data_parallel is False:
        problems.append(
            f"model.provider = {provider!r}: its trainer does not all-reduce gradients across "
            f"torchrun ranks (WORLD_SIZE = {world.size}); use model.provider = 'local', or "
            f"run one process"
        )
    if problems:
        raise ConfigError(problems)


def collective(fn: Any, *args: Any, size: int) -> None:
    """``fn(*args)``, a collective; a peer that went away becomes :class:`RankLost`."""
    try:
        fn(*args)
    except RuntimeError as exc:  # gloo/nccl: DistBackendError, "Connection closed by peer"
        detail = (str(exc).splitlines() or [""])[0][:200]
        raise RankLost(
            f"another process of this torchrun job (world size {size}) stopped, so this one "
            f"cannot continue; its output (or torchrun's report) says why "
            f"[{type(exc).__name__}: {detail}]"
        ) from exc


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
