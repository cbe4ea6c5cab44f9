"""Backoff delays and ``Retry-After`` parsing for the HTTP reliability layer.

:class:`~searchr1.core.search.http_provider.HttpSearchProvider` sleeps
:func:`backoff_delay` seconds before retrying a timeout, a connection error or a 5xx, unless
the server said how long to wait in a ``Retry-After`` header (:func:`parse_retry_after`).
"""

from __future__ import annotations

import random
import time
from email.utils import parsedate_to_datetime

#: a server asking us to wait longer than this is treated as down for this call (no retry):
#: a rollout cannot stall for minutes on one search
MAX_RETRY_AFTER_S = 30.0


def backoff_delay(
    retry: int, base_s: float = 0.25, cap_s: float = 8.0, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first retry).

    Exponential with "equal jitter": half of ``min(cap, base * 2**retry)`` is fixed, the other
    half random, so concurrent callers that failed together do not retry together, and every
    retry still waits at least a little."""
    ceiling = min(cap_s, base_s * (2.0**retry))
    return ceiling / 2.0 + (rng or random).uniform(0.0, ceiling / 2.0)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent
    or unparsable. Negative waits become 0."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
