"""The query caches: (normalised query, top_k) -> results.

The trajectories of one group often send the same query, and a keyed search service bills
every call against a quota, so :class:`~searchr1.kit.search.base.BaseSearchProvider` answers a
repeated query from here. Only successful answers are stored (an error is never replayed).

* :class:`QueryCache` lives as long as the provider, i.e. one run; it is bounded and evicts the
  least recently used entry (``[search] cache``).
* :class:`AnswerStore` keeps the answers of a keyed service on disk, so a resumed run or a
  rerun does not pay again (``[search] disk_cache``, ``cache_ttl_hours``): one SQLite file in
  the cache folder (:func:`answer_store_path`), rows keyed by provider, endpoint (an address
  without query string or user info), normalised query and top_k. No key is ever stored.
  Several runs may share the file (WAL journal, a busy timeout); a write that fails (disk
  full, read-only folder) turns the store off for the run with one warning: a cache must
  never stop training. A damaged file (SQLite says it is not a database, or malformed) is
  discarded with a warning and a new one started: it only holds answers the service can give
  again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path

from searchr1.core.logs import get_logger
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


def _damaged(exc: Exception) -> bool:
    """Whether SQLite refused the file itself: not a database, or a malformed one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def answer_store_path() -> Path:
    """``$SEARCHR1_SEARCH_CACHE`` when set, else ``search/answers.sqlite`` in the cache folder
    (``$SEARCHR1_CACHE``, default ``~/.cache/searchr1``)."""
    from searchr1.core.assets import cache_dir

    given = os.environ.get("SEARCHR1_SEARCH_CACHE")
    return Path(given) if given else cache_dir() / "search" / "answers.sqlite"


class AnswerStore:
    """Successful answers of one provider and endpoint on disk, for ``ttl_s`` seconds."""

    _SCHEMA = (
        "CREATE TABLE IF NOT EXISTS answers (provider TEXT NOT NULL, endpoint TEXT NOT NULL, "
        "query TEXT NOT NULL, top_k INTEGER NOT NULL, results TEXT NOT NULL, "
        "stored REAL NOT NULL, PRIMARY KEY (provider, endpoint, query, top_k))"
    )

    def __init__(self, path: Path, provider: str, endpoint: str, ttl_s: float):
        self.path = path
        self._scope = (provider, endpoint)
        self._ttl_s = ttl_s
        self._db: sqlite3.Connection | None = None
        self._discarded = False
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # one provider, one caller at a time, but not always the same thread (a stage or
            # an eval may run its own event loop in a worker thread)
            db = sqlite3.connect(
                self.path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(self._SCHEMA)
                # answers past their TTL are never read again: drop this scope's
                db.execute(
                    "DELETE FROM answers WHERE provider=? AND endpoint=? AND stored < ?",
                    (*self._scope, time.time() - self._ttl_s),
                )
            except sqlite3.Error:
                db.close()
                raise
            self._db = db
        except (OSError, sqlite3.Error) as exc:
            self._off(exc)

    @property
    def active(self) -> bool:
        return self._db is not None

    def get(self, key: CacheKey) -> tuple[SearchResult, ...] | None:
        if self._db is None:
            return None
        try:
            row = self._db.execute(
                "SELECT results, stored FROM answers WHERE provider=? AND endpoint=? "
                "AND query=? AND top_k=?",
                (*self._scope, *key),
            ).fetchone()
        except sqlite3.Error as exc:
            self._off(exc)
            return None
        if row is None or time.time() - row[1] > self._ttl_s:
            return None
        try:
            return tuple(SearchResult(**r) for r in json.loads(row[0]))
        except (ValueError, TypeError):  # a row another version wrote: ask the service
            return None

    def put(self, key: CacheKey, results: tuple[SearchResult, ...]) -> None:
        if self._db is None:
            return
        body = json.dumps(
            [{"title": r.title, "text": r.text, "url": r.url, "score": r.score} for r in results]
        )
        try:
            self._db.execute(
                "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?)",
                (*self._scope, *key, body, time.time()),
            )
        except sqlite3.Error as exc:
            self._off(exc)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _off(self, exc: Exception) -> None:
        self.close()
        if _damaged(exc) and not self._discarded:
            self._discarded = True
            get_logger().warning(
                "search_disk_cache_damaged",
                path=str(self.path),
                error=f"{type(exc).__name__}: {exc}",
                action="discarded; a new one is started (its answers are asked again)",
            )
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._open()
            return
        get_logger().warning(
            "search_disk_cache_off",
            path=str(self.path),
            error=f"{type(exc).__name__}: {exc}",
            hint="answers are not kept for later runs; free space or fix the folder's "
            "permissions, or set SEARCHR1_SEARCH_CACHE to a writable file",
        )
