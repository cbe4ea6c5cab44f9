"""One ``sample()`` call on its way from the event loop to the sampling thread and back.

:meth:`~searchr1.plugins.local_model.sampler.BatchedSampler.sample` (on the event loop) checks
the call with :func:`check_request`, so a bad request raises in its caller and never reaches
a batch, then queues a :class:`SampleRequest` and awaits its future. The worker thread runs
the request in some batch and hands the samples (or the batch's exception) back with
:func:`resolve`, which is safe to call from any thread: it schedules the answer on the
caller's own loop, and drops it if the caller was cancelled or its loop is gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from searchr1.kit.learner.requests import check_request
from searchr1.sdk import SampledSequence, SamplingParams

__all__ = ["SampleRequest", "check_request", "resolve"]


@dataclass
class SampleRequest:
    """A checked request: ``num_samples`` continuations of ``prompt`` under ``params``,
    answered through ``future`` on ``loop``."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    future: asyncio.Future[list[SampledSequence]]
    loop: asyncio.AbstractEventLoop


def resolve(
    request: SampleRequest,
    result: list[SampledSequence] | None = None,
    exc: BaseException | None = None,
) -> None:
    """Answer ``request`` with ``result`` or raise ``exc`` in its caller (any thread)."""

    def deliver() -> None:
        if request.future.done():  # the caller was cancelled
            return
        if exc is not None:
            request.future.set_exception(exc)
        else:
            request.future.set_result(result)  # type: ignore[arg-type]

    try:
        request.loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the caller's event loop is closed
        pass
