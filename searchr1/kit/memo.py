"""Remembered answers of a remote call (a search, a judge's verdict): :class:`Memo`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
R = TypeVar("R")


class Store(Protocol[K, V]):
    """Answers kept on disk across runs (:class:`~searchr1.kit.search.cache.DiskStore`
    underneath); ``active`` is False once the store is off for the run."""

    @property
    def active(self) -> bool: ...

    def get(self, key: K) -> V | None: ...

    def put(self, key: K, value: V) -> None: ...

    def close(self) -> None: ...


class Memo(Generic[K, V]):
    """Answers by key: this run's ``memory`` (a dict or an LRU; None: none kept), a disk
    ``store`` (or ``open_store()``, called on first use), and the calls in flight, so that two
    concurrent calls of one key make one remote call (:meth:`share`)."""

    def __init__(
        self,
        memory: MutableMapping[K, V] | None,
        store: Store[K, V] | None = None,
        *,
        open_store: Callable[[], Store[K, V] | None] | None = None,
    ) -> None:
        self.memory = memory
        self._store, self._open_store = store, open_store
        self._inflight: dict[K, asyncio.Future[object]] = {}

    @property
    def store(self) -> Store[K, V] | None:
        """The disk store while it is on."""
        if self._open_store is not None:
            self._store, self._open_store = self._open_store(), None
        return self._store if self._store is not None and self._store.active else None

    @property
    def on(self) -> bool:
        """Something is kept (this run's memory or a disk store)."""
        return self.memory is not None or self.store is not None

    def recall(self, key: K) -> tuple[V | None, bool]:
        """``(value, from disk)``: what memory, else the disk store, holds for ``key`` (a disk
        hit is kept in memory too), or ``(None, False)``."""
        value = self.memory.get(key) if self.memory is not None else None
        store = self.store if value is None else None
        if store is None:
            return value, False
        value = store.get(key)
        if value is not None and self.memory is not None:
            self.memory[key] = value
        return value, value is not None

    def remember(self, key: K, value: V) -> None:
        if self.memory is not None:
            self.memory[key] = value
        if (store := self.store) is not None:
            store.put(key, value)

    async def share(
        self, key: K, call: Callable[[], Awaitable[R]], keep: Callable[[R], V | None]
    ) -> tuple[R, bool]:
        """``(call()'s result, shared)``: a call of ``key`` already in flight is awaited
        instead (``shared``), else this one is made, and ``keep(result)``, when not None, is
        remembered before the callers waiting on it see the result. A caller whose call in
        flight was cancelled makes its own."""
        leader = self._inflight.get(key)
        if leader is not None:
            try:
                return await asyncio.shield(leader), True  # type: ignore[return-value]
            except asyncio.CancelledError:
                if not leader.cancelled():
                    raise  # this caller was cancelled
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await call()
            value = keep(result)
            if value is not None:
                self.remember(key, value)
            future.set_result(result)
            return result, False
        finally:
            if not future.done():
                future.cancel()
            if self._inflight.get(key) is future:
                del self._inflight[key]

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
