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
from collections.abc import Sequence
from dataclasses import dataclass

from searchr1.sdk import SampledSequence, SamplingParams


@dataclass
class SampleRequest:
    """A checked request: ``num_samples`` continuations of ``prompt`` under ``params``,
    answered through ``future`` on ``loop``."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    future: asyncio.Future[list[SampledSequence]]
    loop: asyncio.AbstractEventLoop


def check_request(
    prompt_tokens: Sequence[int],
    num_samples: int,
    params: SamplingParams,
    *,
    vocab_size: int,
    context_length: int,
    context: str = "the model's context",
) -> list[int]:
    """The prompt as a list of ints; ValueError naming the argument for anything a batch
    could not run (an empty prompt, ids outside the vocabulary, a prompt that fills
    ``context``, out-of-range sampling parameters)."""
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise ValueError("sample(): prompt_tokens is empty")
    if num_samples < 1:
        raise ValueError(f"sample(): num_samples must be >= 1, got {num_samples}")
    if params.max_tokens < 1:
        raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if any(not isinstance(x, str) or not x for x in params.stop_strings):
        raise ValueError(
            f"SamplingParams.stop_strings must be non-empty strings, got {params.stop_strings!r}"
        )
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"sample(): prompt_tokens holds ids outside the vocabulary "
            f"(size {vocab_size}): {bad[:5]}"
        )
    if len(prompt) >= context_length:
        raise ValueError(
            f"sample(): the prompt has {len(prompt)} tokens, {context} is "
            f"{context_length}; nothing can be generated"
        )
    return prompt


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
