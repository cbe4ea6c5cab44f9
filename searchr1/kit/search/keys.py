"""The API key pool: round-robin over keys, benching keys that a service refused.

Owned by :class:`~searchr1.kit.search.http_provider.HttpSearchProvider`. Each HTTP attempt
takes the next key that is not benched (:meth:`KeyPool.acquire`); a key answering 429 is
benched for a cool-down (default: the whole run, since quotas are daily), a key answering
401/403 for the whole run. When every key is benched the pool is *exhausted*: the provider
reports the environment as down (``available()`` is False) so the train loop stops rather than
train on failures. Keys are only ever identified by their **index** in logs.

A pool created with no keys holds one anonymous slot (``None``): services without
authentication go through the same code, and a 401 still marks them down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from searchr1.core.logs import get_logger, register_secrets


class KeyPool:
    """Round-robin key selection with per-key benching. Not thread-safe (one event loop)."""

    def __init__(
        self,
        keys: Sequence[str],
        cooldown_s: float = math.inf,
        *,
        provider: str = "search",
        clock: Callable[[], float] = time.monotonic,
    ):
        register_secrets(keys)
        self._keys: list[str | None] = list(keys) if keys else [None]
        self._benched_until = [0.0] * len(self._keys)
        self._next = 0
        self._cooldown_s = cooldown_s
        self._provider = provider
        self._clock = clock
        self._down_logged = False
        #: key index -> why it was last benched (smoke names these indexes in its verdict)
        self.bench_reasons: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def anonymous(self) -> bool:
        return self._keys == [None]

    def available_count(self) -> int:
        now = self._clock()
        return sum(1 for until in self._benched_until if until <= now)

    def acquire(self) -> tuple[int, str | None] | None:
        """The next usable ``(index, key)`` in round-robin order, or None when all are
        benched."""
        now = self._clock()
        n = len(self._keys)
        for step in range(n):
            index = (self._next + step) % n
            if self._benched_until[index] <= now:
                self._next = (index + 1) % n
                self._down_logged = False
                return index, self._keys[index]
        return None

    def bench(self, index: int, reason: str, seconds: float | None = None) -> None:
        """Take key ``index`` out of rotation for ``seconds`` (default: the pool's cool-down;
        ``inf`` = the rest of the run). Logs the key's index and the reason, never the key."""
        seconds = self._cooldown_s if seconds is None else max(0.0, seconds)
        self._benched_until[index] = max(self._benched_until[index], self._clock() + seconds)
        self.bench_reasons[index] = reason
        log = get_logger()
        log.warning(
            "search_key_benched",
            provider=self._provider,
            key_index=index,
            keys_total=len(self._keys),
            reason=reason,
            benched_for_s=None if math.isinf(seconds) else round(seconds, 3),
            keys_available=self.available_count(),
        )
        if self.available_count() == 0 and not self._down_logged:
            self._down_logged = True
            log.error(
                "search_environment_down",
                provider=self._provider,
                keys_total=len(self._keys),
                hint="every API key is benched (quota exhausted or rejected); add keys or wait",
            )
