"""Per-step counters of one search provider.

A provider owns one :class:`SearchMetrics`. :class:`~searchr1.kit.search.base.BaseSearchProvider`
records one outcome per ``search`` call; the HTTP layer records one entry per HTTP attempt.
The train loop calls the provider's ``metrics(reset=True)`` once per step and logs the values
under ``search/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

#: latencies kept per step; beyond this the oldest half is dropped (percentiles stay useful)
_MAX_LATENCIES = 100_000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` in [0, 100] of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class SearchMetrics:
    """Raw counters since the last reset; :meth:`snapshot` turns them into rates."""

    calls: int = 0
    invalid_queries: int = 0
    truncated_queries: int = 0
    cache_hits: int = 0
    disk_hits: int = 0
    paid_calls: int = 0
    errors: int = 0
    empty: int = 0
    results: int = 0
    # HTTP attempts (one per request sent, retries and key switches included)
    attempts: int = 0
    key_retries: int = 0
    retries: int = 0
    http_429: int = 0
    auth_errors: int = 0
    timeouts: int = 0
    connection_errors: int = 0
    server_errors: int = 0
    http_errors: int = 0
    malformed_responses: int = 0
    api_errors: int = 0
    unavailable: int = 0
    latencies: list[float] = field(default_factory=list)

    def add_latency(self, seconds: float) -> None:
        if len(self.latencies) >= _MAX_LATENCIES:
            del self.latencies[: _MAX_LATENCIES // 2]
        self.latencies.append(seconds)

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, [] if f.name == "latencies" else 0)

    def snapshot(self, *, http: bool = False, spend: bool = False) -> dict[str, float]:
        """Rates and raw counts, named without the ``search/`` prefix: the call counters,
        with ``http`` the HTTP attempts' (``attempts`` .. ``key_retries``), with ``spend``
        ``paid_calls``, ``cache_hits`` and ``disk_hits``."""
        valid = self.calls - self.invalid_queries
        answered = valid - self.errors

        def rate(num: int, den: int) -> float:
            return num / den if den else 0.0

        out: dict[str, float] = {
            "calls": float(self.calls),
            "success_rate": rate(answered, valid) if valid else 1.0,
            "error_rate": rate(self.errors, valid),
            "latency_p50": percentile(self.latencies, 50),
            "latency_p95": percentile(self.latencies, 95),
            "cache_hit_rate": rate(self.cache_hits, valid),
            "results_per_call": rate(self.results, answered),
            "empty_rate": rate(self.empty, valid),
            "errors": float(self.errors),
            "invalid_queries": float(self.invalid_queries),
            "truncated_queries": float(self.truncated_queries),
        }
        if http:
            out["429_rate"] = rate(self.http_429, self.attempts)
            out["timeout_rate"] = rate(self.timeouts, self.attempts)
            out.update({name: float(getattr(self, name)) for name in _HTTP_COUNTERS})
        if spend:
            out.update({name: float(getattr(self, name)) for name in _SPEND_COUNTERS})
        return out


#: the counters of HTTP attempts, reported by a provider that sends HTTP requests
_HTTP_COUNTERS = (
    "attempts", "key_retries", "retries", "http_429", "auth_errors", "timeouts",
    "connection_errors", "server_errors", "http_errors", "malformed_responses", "api_errors",
    "unavailable",
)  # fmt: skip
#: what a keyed (billed) service's calls cost and what answered them instead
_SPEND_COUNTERS = ("paid_calls", "cache_hits", "disk_hits")
