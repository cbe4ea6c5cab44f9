"""When to retry an HTTP request and how long to wait: the arithmetic of
:class:`searchr1.kit.http.HttpClient` (which every HTTP plugin sends through), kept apart
from the client so it can be read and tested on its own.
"""

from __future__ import annotations

import random
import time
from email.utils import parsedate_to_datetime


def is_retryable_status(status: int) -> bool:
    """408 (request timeout), 409 (conflict, e.g. a busy resource), 429 and every 5xx."""
    return status in (408, 409, 429) or 500 <= status <= 599


def backoff_delay(
    retry: int, base_s: float = 0.5, cap_s: float = 8.0, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first): uniform in
    ``[0, min(cap_s, base_s * 2**retry)]`` ("full jitter", the spread that de-synchronises a
    crowd of clients best)."""
    ceiling = min(cap_s, base_s * (2.0**retry))
    return (rng or random).uniform(0.0, ceiling)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent
    or unparsable. Negative waits (a date in the past) become 0."""
    if value is None or not value.strip():
        return None
    value = value.strip()
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
