"""The parts of the shared search layer: key pool, backoff, Retry-After, cache, metrics, and
the base provider's last line of defence."""

from __future__ import annotations

import asyncio
import math
import random
from email.utils import formatdate

import pytest
import tenacity
from structlog.testing import capture_logs

from searchr1.core.config_schema import SearchConfig
from searchr1.core.types import SearchResponse, SearchResult
from searchr1.kit.retry import full_jitter, parse_retry_after
from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.cache import cache_key, normalise_query, run_cache
from searchr1.kit.search.keys import KeyPool
from searchr1.kit.search.metrics import SearchMetrics, percentile


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_key_pool_round_robin_skips_benched_keys_until_the_cool_down_ends() -> None:
    clock = FakeClock()
    pool = KeyPool(["key-a-secret", "key-b-secret", "key-c-secret"], 60.0, clock=clock)
    assert [pool.acquire()[0] for _ in range(4)] == [0, 1, 2, 0]
    pool.bench(1, "quota exhausted (429)")
    assert [pool.acquire()[0] for _ in range(3)] == [2, 0, 2]
    assert pool.available_count() == 2
    clock.now += 61
    assert pool.available_count() == 3


def test_key_pool_exhausted_logs_environment_down_once_without_keys() -> None:
    pool = KeyPool(["key-a-secret", "key-b-secret"], math.inf)
    with capture_logs() as logs:
        pool.bench(0, "quota exhausted (429)")
        pool.bench(1, "key rejected (401)", math.inf)
        assert pool.acquire() is None
        pool.bench(1, "again")
    assert [e["event"] for e in logs].count("search_environment_down") == 1
    assert "secret" not in repr(logs)
    assert [e["key_index"] for e in logs if e["event"] == "search_key_benched"] == [0, 1, 1]


def test_key_pool_without_keys_has_one_anonymous_slot() -> None:
    pool = KeyPool([])
    assert pool.anonymous and pool.acquire() == (0, None)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    wait = full_jitter(0.1, 2.0, random.Random(1))
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    for retry in range(8):
        state.attempt_number = retry + 1  # the wait after the first attempt is retry 0's
        ceiling = min(2.0, 0.1 * 2**retry)
        delays = [wait(state) for _ in range(50)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered
        assert max(delays) > ceiling / 2  # full jitter spans the whole range


def test_retry_after_parses_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(formatdate(1_000_010, usegmt=True), now=1_000_000) == 10.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_query_cache_normalises_and_evicts_least_recently_used() -> None:
    assert normalise_query("  Who  IS\tX? ") == "who is x?"
    cache = run_cache(max_entries=2)
    hit = (SearchResult("t", "x"),)
    cache[cache_key("A", 3)] = hit
    cache[cache_key("b", 3)] = ()
    assert cache.get(cache_key(" a ", 3)) == hit  # "a" is now most recent
    assert cache.get(cache_key("a", 2)) is None  # top_k is part of the key
    cache[cache_key("c", 3)] = ()
    assert cache.get(cache_key("b", 3)) is None and len(cache) == 2


def test_percentile_and_rates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0
    m = SearchMetrics(calls=10, invalid_queries=2, errors=2, attempts=10, http_429=3, results=12)
    snap = m.snapshot(http=True)
    assert snap["success_rate"] == 0.75 and snap["error_rate"] == 0.25
    assert snap["429_rate"] == 0.3 and snap["results_per_call"] == 2.0
    # a provider that sends no HTTP request and bills nothing reports neither group
    assert not {"429_rate", "attempts", "paid_calls", "cache_hits"} & set(m.snapshot())
    assert {"paid_calls", "cache_hits", "disk_hits"} <= set(m.snapshot(spend=True))
    m.reset()
    assert m.snapshot()["calls"] == 0 and m.snapshot()["success_rate"] == 1.0


class Exploding(BaseSearchProvider):
    name = "exploding"

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        raise RuntimeError("bug in a provider")


def test_a_provider_bug_becomes_an_error_response_not_an_exception() -> None:
    provider = Exploding(SearchConfig())
    with capture_logs() as logs:
        response = asyncio.run(provider.search("q", 3))
    assert response.error == "search failed (internal error)"
    assert provider.metrics()["errors"] == 1
    assert logs[0]["event"] == "search_internal_error"


class Slow(BaseSearchProvider):
    name = "slow"

    def __init__(self) -> None:
        super().__init__(SearchConfig())
        self.started = 0

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        self.started += 1
        await asyncio.sleep(0.05)
        return SearchResponse(results=(SearchResult("t", query),))


def test_a_cancelled_leader_does_not_break_callers_sharing_its_query() -> None:
    provider = Slow()

    async def go() -> SearchResponse:
        leader = asyncio.create_task(provider.search("q", 3))
        await asyncio.sleep(0.01)
        follower = asyncio.create_task(provider.search("q", 3))
        await asyncio.sleep(0.01)
        leader.cancel()
        return await follower

    response = asyncio.run(go())
    assert response.ok and provider.started == 2


@pytest.mark.parametrize("query", ["", "   ", "\n\t", None])
def test_empty_queries_never_reach_the_backend(query) -> None:
    provider = Exploding(SearchConfig())
    assert asyncio.run(provider.search(query, 3)).error == "empty query"
