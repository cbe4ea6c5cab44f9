"""The query caches: (normalised query, top_k) -> results.

The trajectories of one group often send the same query, and a keyed search service bills
every call against a quota, so :class:`~searchr1.kit.search.base.BaseSearchProvider` answers a
repeated query from here. Only successful answers are stored (an error is never replayed).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path

import cachetools
import diskcache

from searchr1.sdk import SearchResult, get_logger

CacheKey = tuple[str, int]
#: the run cache's bound, in answers
RUN_CACHE_ENTRIES = 100_000


def normalise_query(query: str) -> str:
    """Case-folded, whitespace-collapsed query: ``"  Who  is X? "`` == ``"who is x?"``."""
    return " ".join(query.casefold().split())


def cache_key(query: str, top_k: int) -> CacheKey:
    """The key of ``query``'s answer with ``top_k`` results, in both caches."""
    return normalise_query(query), top_k


def run_cache(max_entries: int = RUN_CACHE_ENTRIES) -> cachetools.LRUCache:
    """The run's bounded LRU map from :func:`cache_key` to a tuple of results."""
    return cachetools.LRUCache(maxsize=max_entries)


def answer_store_path() -> Path:
    """``$SEARCHR1_SEARCH_CACHE`` when set, else ``search/answers`` in the cache folder
    (``$SEARCHR1_CACHE``, default ``~/.cache/searchr1``): the folder of the disk caches."""
    from searchr1.sdk import cache_dir

    given = os.environ.get("SEARCHR1_SEARCH_CACHE")
    return Path(given) if given else cache_dir() / "search" / "answers"


def _damaged(exc: BaseException) -> bool:
    """Whether SQLite refused the file itself: not a database, or a malformed one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


#: the first bytes of every SQLite file (an earlier version's single-file store)
_SQLITE_HEADER = b"SQLite format 3\0"
#: the tables of an earlier version's single-file store (search answers, judge verdicts)
_OLD_TABLES = frozenset({"answers", "verdicts"})


def _is_sqlite_file(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        return fh.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER


def _is_old_store(path: Path) -> bool:
    """Whether ``path`` is an earlier version's single-file store: an SQLite file whose
    tables are its ``answers`` and ``verdicts`` and nothing else (any other database is
    someone else's and is never removed)."""
    if not _is_sqlite_file(path):
        return False
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?immutable=1", uri=True)
        try:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            db.close()
    except sqlite3.Error:  # damaged, or not readable: not known to be one
        return False
    tables = {name for (name,) in rows}
    return bool(tables) and tables <= _OLD_TABLES


_HEX = frozenset("0123456789abcdef")


def _not_a_cache(path: Path) -> str | None:
    """What ``path`` is when it is not a cache folder that a store may write to (None: it
    is one, or nothing yet): a file, or a folder holding what a ``diskcache`` folder does not
    (its database and the two-hex-digit folders of large values; hidden entries aside)."""
    if path.is_file():
        return "a file, not a cache folder"
    if not path.is_dir():
        return None
    own = {diskcache.core.DBNAME, f"{diskcache.core.DBNAME}-wal", f"{diskcache.core.DBNAME}-shm"}
    others = sorted(
        entry.name
        for entry in path.iterdir()
        if not entry.name.startswith(".")
        and entry.name not in own
        and not (entry.is_dir() and len(entry.name) == 2 and set(entry.name) <= _HEX)
    )
    if others:
        return f"a folder of other files ({', '.join(others[:3])}), not a cache folder"
    return None


class DiskStore:
    """String values on disk in one ``diskcache`` folder (SQLite underneath: process- and
    thread-safe, so several runs may share it; bounded by diskcache's default 1 GiB, the
    least recently stored evicted first), for one user (``what``: the event prefix,
    ``search`` or ``judge``; ``kept``: what it keeps, for the warnings).

    A cache must never stop training: a folder that fails (disk full, read-only, not a
    folder) turns the store off for the run with one warning (``<what>_disk_cache_off``); a
    damaged database (SQLite says it is not a database, or malformed) is discarded with a
    warning (``<what>_disk_cache_damaged``) and a new one started, as is a single-file store
    of an earlier version found at ``path`` or ``path.sqlite`` (``<what>_disk_cache_old_format``):
    they only hold answers the service can give again. What is not the store's (a file at
    ``path`` other than an earlier store, a folder holding other files: a mistyped
    ``$SEARCHR1_SEARCH_CACHE``) is never written to nor removed: the store is off."""

    _ERRORS = (OSError, ValueError, sqlite3.Error, diskcache.Timeout)  # ValueError: a bad path

    def __init__(self, path: Path, what: str, kept: str):
        self.path = path
        self._what, self._kept = what, kept
        self._cache: diskcache.Cache | None = None
        self._discarded = False
        self._open()

    @property
    def active(self) -> bool:
        return self._cache is not None

    def get(self, key: str) -> str | None:
        if self._cache is None:
            return None
        try:
            value = self._cache.get(key)
        except self._ERRORS as exc:
            self._off(exc)
            return None
        return value if isinstance(value, str) else None  # another version's row: a miss

    def put(self, key: str, value: str, expire_s: float | None = None) -> None:
        """Keep ``value`` for ``expire_s`` seconds (None: until evicted)."""
        if self._cache is None:
            return
        expire = None if expire_s is None or math.isinf(expire_s) else expire_s
        try:
            self._cache.set(key, value, expire=expire)
        except self._ERRORS as exc:
            self._off(exc)

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    def _open(self) -> None:
        try:
            for old in dict.fromkeys((self.path, self.path.with_name(f"{self.path.name}.sqlite"))):
                if _is_old_store(old):
                    get_logger().warning(
                        f"{self._what}_disk_cache_old_format", path=str(old),
                        action=f"the single-file store of an earlier version: removed, a new "
                        f"one started in {self.path} (its {self._kept} are asked again)",
                    )  # fmt: skip
                    self._remove(old)
            if foreign := _not_a_cache(self.path):
                self._refuse(f"{self.path} is {foreign}: left as it is")
                return
            self._cache = diskcache.Cache(self.path, timeout=10.0)
        except self._ERRORS as exc:
            self._off(exc)

    @staticmethod
    def _remove(db: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)

    def _off(self, exc: BaseException) -> None:
        self.close()
        error = f"{type(exc).__name__}: {exc}"
        if _damaged(exc) and not self._discarded:
            self._discarded = True
            db = self.path / diskcache.core.DBNAME
            get_logger().warning(
                f"{self._what}_disk_cache_damaged", path=str(db), error=error,
                action=f"discarded; a new one is started (its {self._kept} are asked again)",
            )  # fmt: skip
            self._remove(db)
            self._open()
            return
        self._refuse(error, "free space or fix the folder's permissions, or set "
                     "SEARCHR1_SEARCH_CACHE to a writable folder")  # fmt: skip

    def _refuse(self, error: str, fix: str = "set SEARCHR1_SEARCH_CACHE to a new folder") -> None:
        """The store off for the run, with its one warning."""
        get_logger().warning(
            f"{self._what}_disk_cache_off", path=str(self.path), error=error,
            hint=f"{self._kept} are not kept for later runs; {fix}",
        )  # fmt: skip


class AnswerStore:
    """Successful answers of one provider and endpoint on disk, for ``ttl_s`` seconds (the
    reading run's TTL decides: each answer keeps the time it was stored)."""

    def __init__(self, path: Path, provider: str, endpoint: str, ttl_s: float):
        self._scope = (provider, endpoint)
        self._ttl_s = ttl_s
        self._disk = DiskStore(path, "search", "answers")

    @property
    def active(self) -> bool:
        return self._disk.active

    def _key(self, key: CacheKey) -> str:
        return json.dumps(["answer", *self._scope, *key], ensure_ascii=False)

    def get(self, key: CacheKey) -> tuple[SearchResult, ...] | None:
        body = self._disk.get(self._key(key))
        if body is None:
            return None
        try:
            row = json.loads(body)
            if time.time() - float(row["stored"]) > self._ttl_s:
                return None
            return tuple(SearchResult(**r) for r in row["results"])
        except (ValueError, TypeError, KeyError):  # a row another version wrote: ask the service
            return None

    def put(self, key: CacheKey, results: tuple[SearchResult, ...]) -> None:
        rows = [{"title": r.title, "text": r.text, "url": r.url, "score": r.score} for r in results]
        body = json.dumps({"stored": time.time(), "results": rows}, ensure_ascii=False)
        self._disk.put(self._key(key), body, expire_s=self._ttl_s)

    def close(self) -> None:
        self._disk.close()
