"""A test's synchronous view of the Trainer contract (``searchr1.core.types.Trainer``): each
call runs to its end in an event loop of its own, as a train step's calls would."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from searchr1.core.types import AdamParams, Datum, ForwardBackwardResult, LossFn

T = TypeVar("T")


async def answered(value: T) -> T:
    """An answer already there, as the awaitable ``forward_backward`` returns."""
    return value


def forward_backward(
    trainer: Any, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
) -> ForwardBackwardResult:
    """One ``forward_backward``, queued and awaited to its result."""

    async def call() -> ForwardBackwardResult:
        return await (await trainer.forward_backward(datums, loss_fn, loss_scale))

    return asyncio.run(call())


def optim_step(trainer: Any, adam: AdamParams) -> Mapping[str, float]:
    """One ``optim_step``, awaited."""
    return asyncio.run(trainer.optim_step(adam))


def load_state(trainer: Any, path: str) -> None:
    """One ``load_state``, awaited."""
    asyncio.run(trainer.load_state(path))


def train_step(
    trainer: Any,
    micro_batches: Sequence[tuple[Sequence[Datum], float]],
    loss_fn: LossFn,
    adam: AdamParams,
) -> tuple[list[ForwardBackwardResult], Mapping[str, float]]:
    """A step as the train loop makes it: every ``(datums, loss_scale)`` queued, then the
    optimizer step, then the results awaited."""

    async def step() -> tuple[list[ForwardBackwardResult], Mapping[str, float]]:
        queued = [await trainer.forward_backward(d, loss_fn, scale) for d, scale in micro_batches]
        metrics = await trainer.optim_step(adam)
        return [await q for q in queued], metrics

    return asyncio.run(step())
