"""What a step runs over: the :class:`Environment` (where trajectories come from and how they
are scored) and the :class:`Job` (the processes that run it and the stop they share). The
trainer is the model's :class:`~searchr1.core.types.Trainer`; the run (folder, events,
checkpoints) builds all three (:attr:`searchr1.core.runs.Run.env`, ``.job``, ``.trainer``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.config_schema import Config
from searchr1.core.distributed import World
from searchr1.core.stop import OnStop, Stop
from searchr1.core.types import RewardFn, Sampler, SearchProvider

T = TypeVar("T")


@dataclass(frozen=True)
class Environment:
    """The agent's world for one rollout: the policy's ``sampler``, the ``search`` it calls,
    the ``protocol`` that turns tokens into actions, the ``reward`` that scores an answer and
    the ``config`` whose ``[rollout]`` limits, ``[model]`` sampling, ``[search] top_k`` and
    ``[train]`` advantage settings the step reads."""

    sampler: Sampler
    search: SearchProvider
    protocol: AgentProtocol
    reward: RewardFn
    config: Config


def _event_only(event: str, detail: str) -> None:
    """A warning as an event alone (a test's or a script's job; a run's also prints it)."""
    structlog.get_logger().warning(event, detail=detail)


def _unseen(task: str, total: int) -> Callable[[], None] | None:
    """No progress shown (a test's or a script's job)."""
    return None


@dataclass(frozen=True)
class Job:
    """The processes running the algorithm together (``world``: torchrun's ranks, or one)
    and the ``stop`` they share. ``warn(event, detail)`` tells the person running it;
    ``progress(task, total)`` gives what to call as each of ``total`` groups is done."""

    world: World = field(default_factory=World)
    stop: Stop = field(default_factory=Stop)
    warn: Callable[[str, str], None] = _event_only
    progress: Callable[[str, int], Callable[[], None] | None] = _unseen

    def check(self, phase: str) -> None:
        """Every rank stops at ``phase``'s boundary (:class:`Interrupted`) when a stop was
        asked of any (under torchrun a collective: call it on every rank at the same point)."""
        self.stop.check(phase, self.world)

    async def phase(
        self, name: str, work: Awaitable[T] | None, *, alone: bool = False, on_stop: OnStop = None
    ) -> T | None:
        """``work`` as the phase ``name`` of this job's ranks (:meth:`Stop.phase`)."""
        return await self.stop.phase(name, work, self.world, alone=alone, on_stop=on_stop)
