"""Micro-batching under three limits (``docs/protocols.md`` §6), after advantages:

* a datum holds at most ``max_datum_tokens`` tokens (checked when it is built);
* a micro-batch holds at most ``max_micro_batch_datums`` datums;
* ``len(micro_batch) * longest_datum <= max_micro_batch_tokens`` (the padded size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from searchr1.core.errors import ConfigValueError
from searchr1.core.types import Datum


@dataclass(frozen=True)
class BatchLimits:
    max_datum_tokens: int
    max_micro_batch_datums: int
    max_micro_batch_tokens: int


class MicroBatchError(ConfigValueError):
    """A datum can never fit in a micro-batch (the ``[train]`` limits are too small)."""


def padded_tokens(batch: Sequence[Datum]) -> int:
    return len(batch) * max((len(d) for d in batch), default=0)


def pack_micro_batches(datums: Sequence[Datum], limits: BatchLimits) -> list[list[Datum]]:
    """Split ``datums`` into micro-batches that respect all three limits."""
    for d in datums:
        if len(d) > min(limits.max_datum_tokens, limits.max_micro_batch_tokens):
            raise MicroBatchError(
                f"trajectory {d.trajectory_id or '?'}: datum of {len(d)} tokens exceeds "
                f"train.max_datum_tokens = {limits.max_datum_tokens} or "
                f"train.max_micro_batch_tokens = {limits.max_micro_batch_tokens}"
            )
    batches: list[list[Datum]] = []
    current: list[Datum] = []
    for d in sorted(datums, key=len, reverse=True):
        longest = len(current[0]) if current else len(d)
        fits = (
            len(current) < limits.max_micro_batch_datums
            and (len(current) + 1) * longest <= limits.max_micro_batch_tokens
        )
        if current and not fits:
            batches.append(current)
            current = []
        current.append(d)
    if current:
        batches.append(current)
    return batches
