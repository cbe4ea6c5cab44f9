"""Which waiting requests run together: the sampler's admission rule.

The sampling thread of :class:`~searchr1.plugins.local_model.sampler.BatchedSampler` calls
:func:`take_requests` to start a batch (``batch=None``) and again between two decoding steps
of a running batch, so requests queued since it began can join it instead of waiting for its
longest row. The rule, oldest request first, skipping any that does not fit.
"""

from __future__ import annotations

from searchr1.plugins.local_model.generation import Batch
from searchr1.plugins.local_model.reuse import RetainedCaches
from searchr1.plugins.local_model.sample_request import SampleRequest


def take_requests(
    backlog: list[SampleRequest],
    batch: Batch | None,
    *,
    max_batch_rows: int,
    max_batch_tokens: int,
    row_tokens: int,
    context_length: int,
    retained: RetainedCaches,
) -> list[SampleRequest]:
    """Remove from ``backlog`` and return the requests that fit next to ``batch`` (None: a
    new batch), in backlog order."""
    rows, end, real = (0, 0, 0) if batch is None else (*batch.projected(), 0)
    if batch is not None:
        real = sum(len(r.job.prompt) + r.max_new for r in batch.rows)
    taken: list[SampleRequest] = []
    for r in list(backlog):
        n = r.num_samples
        r_end = len(r.prompt) + min(r.params.max_tokens, context_length - len(r.prompt))
        new_rows, new_end, new_real = rows + n, max(end, r_end), real + n * r_end
        padded = new_rows * (new_end + row_tokens)
        first = batch is None and not taken
        if first:
            while retained.tokens + padded > max_batch_tokens:
                if not retained.evict_oldest():
                    break
        elif (
            new_rows > max_batch_rows
            or padded + retained.tokens > max_batch_tokens
            or new_rows * new_end > 2 * new_real + 256 * new_rows
        ):
            continue
        backlog.remove(r)
        taken.append(r)
        rows, end, real = new_rows, new_end, new_real
    return taken
