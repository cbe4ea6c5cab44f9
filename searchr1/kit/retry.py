"""When to retry an HTTP request and how long to wait: the pieces of
:class:`searchr1.kit.http.HttpClient` (which every HTTP plugin sends through) that its
``tenacity`` retry loop is made of, kept apart from the client so they can be read and tested
on their own.
"""

from __future__ import annotations

import random
import time
from email.utils import parsedate_to_datetime

import tenacity


def is_retryable_status(status: int) -> bool:
    """408 (request timeout), 409 (conflict, e.g. a busy resource), 429 and every 5xx."""
    return status in (408, 409, 429) or 500 <= status <= 599


class full_jitter(tenacity.wait_exponential):  # noqa: N801 - named like tenacity's waits
    """Seconds to wait before retry ``n`` (0 for the first): uniform in
    ``[0, min(cap_s, base_s * 2**n)]`` ("full jitter", the spread that de-synchronises a crowd
    of clients best). tenacity's own ``wait_random_exponential`` draws from the ``random``
    module; this draws from ``rng``, so a seeded client waits reproducibly."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random | None = None):
        super().__init__(multiplier=base_s, max=cap_s)
        self.rng = rng or random.Random()

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.rng.uniform(0.0, super().__call__(retry_state))


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
