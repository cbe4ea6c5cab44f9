"""The run-level query cache: (normalised query, top_k) -> results.

The trajectories of one group often send the same query, and a keyed search service bills
every call against a daily quota, so :class:`~searchr1.kit.search.base.BaseSearchProvider`
answers a repeated query from here. Only successful answers are stored (an error is never
replayed). The cache lives as long as the provider, i.e. one run; it is bounded and evicts the
least recently used entry.
"""

from __future__ import annotations

from collections import OrderedDict

from searchr1.core.types import SearchResult

CacheKey = tuple[str, int]


def normalise_query(query: str) -> str:
    """Case-folded, whitespace-collapsed query: ``"  Who  is X? "`` == ``"who is x?"``."""
    return " ".join(query.casefold().split())


class QueryCache:
    """A bounded LRU map from :func:`cache_key` to a tuple of results."""

    def __init__(self, max_entries: int = 100_000):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max = max_entries
        self._data: OrderedDict[CacheKey, tuple[SearchResult, ...]] = OrderedDict()

    @staticmethod
    def key(query: str, top_k: int) -> CacheKey:
        return normalise_query(query), top_k

    def get(self, key: CacheKey) -> tuple[SearchResult, ...] | None:
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
        return hit

    def put(self, key: CacheKey, results: tuple[SearchResult, ...]) -> None:
        self._data[key] = results
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
