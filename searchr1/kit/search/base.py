"""The part every search provider shares: input checks, the memo (run cache, disk store,
queries in flight: :class:`~searchr1.kit.memo.Memo`), metrics.

A provider subclasses :class:`BaseSearchProvider` and implements :meth:`_fetch` (one query
to its backend, returning a :class:`SearchResponse` and never raising). The rollout calls
:meth:`search` concurrently from many trajectories; one query asked twice at once is fetched
once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from abc import ABC, abstractmethod

from searchr1.kit.http import bound_loop
from searchr1.kit.memo import Memo
from searchr1.kit.search.cache import AnswerStore, CacheKey, answer_store_path, cache_key, run_cache
from searchr1.kit.search.metrics import SearchMetrics
from searchr1.sdk import SearchConfig, SearchResponse, SearchResult, get_logger

EMPTY_QUERY = "empty query"


class BaseSearchProvider(ABC):
    """Implements the :class:`~searchr1.core.types.SearchProvider` protocol around
    :meth:`_fetch`."""

    #: the name the provider is registered under (used in logs)
    name: str = "search"
    #: the provider sends HTTP requests: its metrics carry the attempt counters and
    #: ``available``
    http: bool = False

    def __init__(self, settings: SearchConfig):
        self.settings = settings
        self._metrics = SearchMetrics()
        #: this run's answers (``[search] cache``), the disk store's, and the calls in flight
        self.memo: Memo[CacheKey, tuple[SearchResult, ...]] = Memo(
            run_cache() if settings.cache else None, open_store=self._answer_store
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        #: paid calls and disk hits over the provider's life (the run), for the spend totals
        self._paid_total = 0
        self._disk_hits_total = 0

    # ------------------------------------------------------------------ to implement

    @abstractmethod
    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        """Ask the backend for ``top_k`` results of a checked, truncated query. Must return a
        response (``error`` set on failure) rather than raise; attempt-level counters go in
        ``self._metrics``."""

    def persistent_scope(self) -> str | None:
        """The endpoint under which answers are kept on disk across runs (no secret in it),
        or None: not kept (the default; keyed HTTP services return their address)."""
        return None

    # ------------------------------------------------------------------ protocol

    async def search(self, query: str, top_k: int) -> SearchResponse:
        """One search; never raises (except for cancellation of the calling task, and
        :class:`~searchr1.kit.http.WrongEventLoop` from a second event loop)."""
        self._loop = bound_loop(self._loop, f"the {self.name} search provider")
        self._metrics.calls += 1
        try:
            return await self._search(query, top_k)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the rollout must survive a provider bug
            self._metrics.errors += 1
            get_logger().error(
                "search_internal_error", provider=self.name, error=type(exc).__name__
            )
            return SearchResponse(error="search failed (internal error)")

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """The step's counters (:meth:`SearchMetrics.snapshot`: the HTTP ones when
        :attr:`http`, the spend and its run totals for a keyed service, one with a
        :meth:`persistent_scope`), ``available`` when :attr:`http`, and
        :meth:`_extra_metrics`."""
        m = self._metrics
        spend = self.persistent_scope() is not None
        out = m.snapshot(http=self.http, spend=spend)
        if self.http:
            out["available"] = 1.0 if self.available() else 0.0
        out.update(self._extra_metrics(reset))
        paid_total = self._paid_total + m.paid_calls
        disk_total = self._disk_hits_total + m.disk_hits
        if spend:
            out["paid_calls_total"] = float(paid_total)
            out["disk_hits_total"] = float(disk_total)
            price = self.settings.cost_per_call
            if price > 0:
                out["cost"] = m.paid_calls * price
                out["cost_total"] = paid_total * price
        if reset:
            self._paid_total, self._disk_hits_total = paid_total, disk_total
            m.reset()
        return out

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        """Release resources (subclasses extend)."""
        self.memo.close()

    def _extra_metrics(self, reset: bool) -> dict[str, float]:
        """Provider-specific values of :meth:`metrics` (per-step ones restart on ``reset``)."""
        return {}

    def _answer_store(self) -> AnswerStore | None:
        """The disk store of this provider's answers (:meth:`persistent_scope`), or None."""
        scope = self.persistent_scope() if self.settings.disk_cache else None
        if scope is None:
            return None
        ttl_s = self.settings.cache_ttl_hours * 3600.0
        return AnswerStore(answer_store_path(), self.name, scope, ttl_s)

    # ------------------------------------------------------------------ internals

    async def _search(self, query: str, top_k: int) -> SearchResponse:
        cleaned = self._clean_query(query, top_k)
        if isinstance(cleaned, SearchResponse):
            return cleaned
        query = cleaned
        if not self.memo.on:
            return self._record(await self._timed_fetch(query, top_k), cached=False)
        key = cache_key(query, top_k)
        hit, from_disk = self.memo.recall(key)
        self._metrics.disk_hits += from_disk
        if hit is not None:
            return self._record(SearchResponse(results=hit, cached=True), cached=True)
        response, shared = await self.memo.share(
            key,
            lambda: self._timed_fetch(query, top_k),
            keep=lambda answer: answer.results if answer.ok else None,
        )
        if shared and response.ok:
            response = dataclasses.replace(response, cached=True)
        return self._record(response, cached=shared and response.ok)

    def _clean_query(self, query: str, top_k: int) -> str | SearchResponse:
        """The query with its whitespace collapsed, cut to ``max_query_chars``; or the
        response refusing an empty query or a bad ``top_k``."""
        m = self._metrics
        if not isinstance(query, str) or not query.strip():
            m.invalid_queries += 1
            return SearchResponse(error=EMPTY_QUERY)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            m.invalid_queries += 1
            return SearchResponse(error=f"invalid top_k {top_k!r} (must be >= 1)")
        query = " ".join(query.split())
        limit = self.settings.max_query_chars
        if len(query) > limit:
            m.truncated_queries += 1
            query = query[:limit].rstrip()
        return query

    async def _timed_fetch(self, query: str, top_k: int) -> SearchResponse:
        start = time.perf_counter()
        response = await self._fetch(query, top_k)
        self._metrics.add_latency(time.perf_counter() - start)
        return response

    def _record(self, response: SearchResponse, *, cached: bool) -> SearchResponse:
        m = self._metrics
        if cached:
            m.cache_hits += 1
        if not response.ok:
            m.errors += 1
        elif not response.results:
            m.empty += 1
        else:
            m.results += len(response.results)
        return response
