"""The API key pool: round-robin over keys, benching keys that fail while others work.

Owned by :class:`~searchr1.kit.search.http_provider.HttpSearchProvider`. Each HTTP attempt
takes the next key that is not benched (:meth:`KeyPool.acquire`) and reports how it went
(:meth:`KeyPool.succeeded` / :meth:`KeyPool.failed`). A key is benched

* at once when the service refused it: 429 (for ``Retry-After`` or the cool-down, default the
  whole run, since quotas are daily) or 401/403 (the whole run);
* when it keeps failing while another key works (its health): ``max_failures`` unusable
  answers in a row (an API error inside a 200, a malformed body) with a success of another key
  since that streak began. Failures every key shares are the service's and bench nobody; so
  are timeouts, connection errors and 5xx, which are retried anyway (counted as a key's, a
  flaky service at 30% faults benched good keys by chance: ``bench/soak.py``). Such a key is
  benched for ``probe_s`` seconds, then taken back for a probe: one more failure benches it
  again for twice as long (at most :data:`MAX_PROBE_S`), a success makes it healthy.

Every bench and unbench is logged with the key's **index**, never the key, once per bench
(calls in flight that meet the same refusal extend it quietly), under the pool's ``events``
prefix (``search_key_benched``, ``judge_key_benched``). When every key is
benched past a short ``Retry-After`` the pool is *exhausted*: the provider reports the
environment as down (``available()`` is False) so the train loop stops rather than train on
failures; keys that a rate limit benched for a few seconds are throttled, not down.

A pool created with no keys holds one anonymous slot (``None``): services without
authentication go through the same code, and a 401 still marks them down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from searchr1.core.errors import RemoteAuthError, RemoteError, RemoteRateLimited
from searchr1.core.logs import get_logger
from searchr1.core.secrets import register_secrets
from searchr1.kit.http import Channel

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
