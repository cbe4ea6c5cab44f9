"""The API key pool: round-robin over keys, benching keys that fail while others work.

Owned by :class:`~searchr1.kit.search.http_provider.HttpSearchProvider`. Each HTTP attempt
takes the next key that is not benched (:meth:`KeyPool.acquire`) and reports how it went
(:meth:`KeyPool.succeeded` / :meth:`KeyPool.failed`). A key is benched
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from searchr1.kit.http import Channel
from searchr1.sdk import (
    RemoteAuthError,
    RemoteError,
    RemoteRateLimited,
    get_logger,
    register_secrets,
)

#: the longest a failing key waits between probes
MAX_PROBE_S = 3600.0


class KeyPool:
    """Round-robin key selection with per-key health and benching. Not thread-safe (one event
    loop)."""

    def __init__(
        self,
        keys: Sequence[str],
        cooldown_s: float = math.inf,
        *,
        provider: str = "search",
        events: str = "search",
        max_failures: int = 3,
        probe_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        register_secrets(keys)
        self._keys: list[str | None] = list(keys) if keys else [None]
        n = len(self._keys)
        self._benched_until = [0.0] * n
        #: True while a key is benched (its return to rotation is logged once)
        self._benched = [False] * n
        #: failures in a row per key, and whether another key succeeded during the streak
        self._streak = [0] * n
        self._others_ok = [False] * n
        #: the next health bench of each key lasts this long (doubles after a failed probe)
        self._probe_s = [probe_s] * n
        self._base_probe_s = probe_s
        self._max_failures = max_failures
        self._next = 0
        self._cooldown_s = cooldown_s
        self._provider = provider
        self._events = events
        self._clock = clock
        self._down_logged = False
        #: key index -> why it was last benched (smoke names these indexes in its verdict)
        self.bench_reasons: dict[int, str] = {}
        #: key index -> the HTTP status (401/403) with which the service rejected it
        self.rejected: dict[int, int] = {}
        #: HTTP attempts sent with each key since the last :meth:`take_calls`
        self.calls = [0] * n

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def anonymous(self) -> bool:
        return self._keys == [None]

    def available_count(self, within_s: float = 0.0) -> int:
        """Keys in rotation now, or back in it within ``within_s`` seconds."""
        horizon = self._clock() + within_s
        return sum(1 for until in self._benched_until if until <= horizon)

    def others_available(self, index: int) -> bool:
        """Whether a key other than ``index`` is in rotation now."""
        now = self._clock()
        return any(u <= now for i, u in enumerate(self._benched_until) if i != index)

    def acquire(self) -> tuple[int, str | None] | None:
        """The next usable ``(index, key)`` in round-robin order, or None when all are
        benched. A key whose bench ran out is logged as back in rotation."""
        now = self._clock()
        n = len(self._keys)
        for step in range(n):
            index = (self._next + step) % n
            if self._benched_until[index] <= now:
                self._next = (index + 1) % n
                self._down_logged = False
                if self._benched[index]:
                    self._benched[index] = False
                    get_logger().info(
                        f"{self._events}_key_unbenched",
                        provider=self._provider,
                        key_index=index,
                        keys_total=n,
                        reason="cool-down over; the key is tried again",
                        keys_available=self.available_count(),
                    )
                self.calls[index] += 1
                return index, self._keys[index]
        return None

    def succeeded(self, index: int) -> None:
        """Key ``index`` got a usable answer."""
        if self._streak[index] >= self._max_failures:
            get_logger().info(
                f"{self._events}_key_healthy",
                provider=self._provider,
                key_index=index,
                keys_total=len(self._keys),
                failures_before=self._streak[index],
            )
        self._streak[index] = 0
        self._others_ok[index] = False
        self._probe_s[index] = self._base_probe_s
        for other in range(len(self._keys)):
            if other != index and self._streak[other]:
                self._others_ok[other] = True

    def failed(self, index: int, reason: str) -> None:
        """Key ``index`` failed (``reason`` names the kind, never the key): benched when it
        keeps failing while another key works."""
        self._streak[index] += 1
        if self._streak[index] < self._max_failures or not self._others_ok[index]:
            return
        if self._benched_until[index] > self._clock():
            return  # already benched (an attempt that was in flight when it was benched)
        seconds = self._probe_s[index]
        self._probe_s[index] = min(MAX_PROBE_S, seconds * 2)
        self.bench(
            index, f"failing while other keys work ({self._streak[index]} in a row: {reason})",
            seconds,
        )  # fmt: skip

    def take_calls(self) -> list[int]:
        """Attempts per key since the last call (the per-step spend), then zeroed."""
        calls, self.calls = self.calls, [0] * len(self._keys)
        return calls

    def bench(
        self, index: int, reason: str, seconds: float | None = None, *, rejected: int = 0
    ) -> None:
        """Take key ``index`` out of rotation for ``seconds`` (default: the pool's cool-down;
        ``inf`` = the rest of the run); ``rejected``: the 401/403 that refused it. Logs the
        key's index and the reason, never the key."""
        if rejected:
            self.rejected[index] = rejected
        seconds = self._cooldown_s if seconds is None else max(0.0, seconds)
        until = self._clock() + seconds
        again = self._benched[index] and self._benched_until[index] > self._clock()
        self._benched_until[index] = max(self._benched_until[index], until)
        self._benched[index] = True
        if again and self.bench_reasons.get(index) == reason:
            return  # a call in flight met the same refusal: one warning per bench
        self.bench_reasons[index] = reason
        log = get_logger()
        log.warning(
            f"{self._events}_key_benched",
            provider=self._provider,
            key_index=index,
            keys_total=len(self._keys),
            reason=reason,
            **(
                {"benched_for": "the run"}
                if math.isinf(seconds)
                else {"benched_for_s": round(seconds, 3)}
            ),
            keys_available=self.available_count(),
        )
        if self.available_count() == 0 and not self._down_logged:
            self._down_logged = True
            log.error(
                "search_environment_down" if self._events == "search" else f"{self._events}_down",
                provider=self._provider,
                keys_total=len(self._keys),
                hint="every API key is benched (quota exhausted, rejected or failing); add "
                "keys or wait",
            )

    def failure_for_run(self, channel: Channel) -> RemoteError | None:
        """The failure no wait mends, as ``channel``'s error: every key benched for the rest
        of the run (rejected, or a cool-down of ``inf``). A rejected key makes it a
        :class:`RemoteAuthError` (exit 2: the key is to fix), else a
        :class:`RemoteRateLimited`. None while a key is usable or will be."""
        if any(not math.isinf(until) for until in self._benched_until):
            return None
        what = "; ".join(
            f"key {i}: {self.bench_reasons.get(i, 'benched')}" for i in range(len(self._keys))
        )
        status = next(iter(self.rejected.values()), None)
        cls = RemoteAuthError if status is not None else RemoteRateLimited
        return channel.failed(cls, f"every key is benched for the run: {what}", status=status)
