"""Per-step counters of one search provider.

A provider owns one :class:`SearchMetrics`. :class:`~searchr1.kit.search.base.BaseSearchProvider`
records one outcome per ``search`` call; the HTTP layer records one entry per HTTP attempt.
The train loop calls the provider's ``metrics(reset=True)`` once per step and logs the values
under ``search/``.

Definitions (a step with no calls reports rates of 0 and a success rate of 1):

* ``calls``: every ``search`` call; ``invalid_queries`` (empty / whitespace / bad ``top_k``)
  are answered with an error without reaching the backend and are **not** part of the
  success rate, because they measure the policy, not the environment.
* ``success_rate`` / ``error_rate``: over valid calls, answered (from the backend or the
  cache) versus failed. ``empty_rate``: valid calls answered with zero results.
* ``429_rate``, ``timeout_rate``: over HTTP attempts (retries included).
* ``cache_hit_rate``: valid calls served from the run cache, from answers kept on disk by
  earlier runs (also counted in ``disk_hits``) or by joining an identical query already in
  flight.
* ``paid_calls``: HTTP answers a keyed service sent (2xx, usable or not: what it bills);
  ``key_retries``: requests moved to another key after an unusable 2xx.
* ``latency_p50`` / ``latency_p95``: seconds, over calls that went to the backend.
* ``results_per_call``: mean number of results of the successful calls.
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
    key_retries: int = 0
    errors: int = 0
    empty: int = 0
    results: int = 0
    # HTTP attempts (one per request sent, retries and key switches included)
    attempts: int = 0
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

    def snapshot(self) -> dict[str, float]:
        """Rates and raw counts, named without the ``search/`` prefix."""
        valid = self.calls - self.invalid_queries
        answered = valid - self.errors

        def rate(num: int, den: int) -> float:
            return num / den if den else 0.0

        out: dict[str, float] = {
            "calls": float(self.calls),
            "success_rate": rate(answered, valid) if valid else 1.0,
            "error_rate": rate(self.errors, valid),
            "429_rate": rate(self.http_429, self.attempts),
            "timeout_rate": rate(self.timeouts, self.attempts),
            "latency_p50": percentile(self.latencies, 50),
            "latency_p95": percentile(self.latencies, 95),
            "cache_hit_rate": rate(self.cache_hits, valid),
            "results_per_call": rate(self.results, answered),
            "empty_rate": rate(self.empty, valid),
        }
        for f in fields(self):
            if f.name not in ("calls", "latencies", "results", "empty"):
                out[f.name] = float(getattr(self, f.name))
        return out
