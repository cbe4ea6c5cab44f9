"""The one reliability layer for every HTTP search provider.

A provider plugin subclasses :class:`HttpSearchProvider`, implements ``_fetch`` and, inside it,
calls :meth:`HttpSearchProvider.request` with two small functions: one that builds the
``httpx.Request`` for a given key, one that parses a 2xx response (raising
:class:`ResponseError` for an unusable body). ``request`` then

* takes keys round-robin from a :class:`~searchr1.core.search.keys.KeyPool`; a 429 benches the
  key (for ``Retry-After`` seconds when given, else ``[search] key_cooldown_seconds``) and the
  request moves to the next key; 401/403 benches the key for the run;
* retries timeouts, connection errors, 408 and 5xx up to ``[search] max_retries`` times with
  exponential backoff and jitter, or after ``Retry-After`` when the server sends one;
* holds one slot of a per-provider semaphore (``[search] max_concurrency``) per HTTP attempt
  (never while sleeping), so a group of 64 trajectories cannot flood the service;
* bounds each attempt by ``[search] timeout_seconds`` end to end;
* counts every attempt and outcome in the provider's metrics;
* returns a short, model-readable error instead of raising, and never puts a key in it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx

from searchr1.core.config import SearchConfig
from searchr1.core.search.base import BaseSearchProvider
from searchr1.core.search.keys import KeyPool
from searchr1.core.search.retry import MAX_RETRY_AFTER_S, backoff_delay, parse_retry_after

T = TypeVar("T")

#: model-readable errors (the observation a trajectory sees when a search fails)
ERR_QUOTA = "quota exhausted (429)"
ERR_DOWN = "search unavailable (every API key is benched)"
ERR_TIMEOUT = "timeout"
ERR_CONNECTION = "connection error"


class ResponseError(Exception):
    """Raised by a provider's parser for an HTTP 2xx that carries no usable answer.

    ``kind`` picks the counter (``"malformed"``: not JSON or the wrong shape; ``"api"``: the
    service reported an error in the body, e.g. Zhihu's ``Code != 0``); the message is the
    model-readable error and must not contain a key."""

    def __init__(self, message: str, kind: str = "malformed"):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Fetched(Generic[T]):
    """The outcome of :meth:`HttpSearchProvider.request`: a parsed value or an error."""

    value: T | None = None
    error: str | None = None


RequestBuilder = Callable[[httpx.AsyncClient, "str | None"], httpx.Request]
ResponseParser = Callable[[httpx.Response], T]


class HttpSearchProvider(BaseSearchProvider):
    """Key pool, retries, concurrency limit and a pooled ``httpx.AsyncClient`` for one
    provider; see the module docstring."""

    #: used when ``[search] api_base`` is empty
    default_api_base: str = ""

    def __init__(
        self,
        settings: SearchConfig,
        *,
        backoff_base_s: float = 0.25,
        backoff_cap_s: float = 8.0,
        rng: random.Random | None = None,
    ):
        super().__init__(settings)
        self.api_base = (settings.api_base or self.default_api_base).rstrip("/")
        self.keys = KeyPool(settings.api_keys, settings.key_cooldown_seconds, provider=self.name)
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._rng = rng or random.Random()
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ protocol

    def available(self) -> bool:
        """False once every key is benched: the environment is down."""
        return self.keys.available_count() > 0

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except RuntimeError:  # bound to a loop that is gone; nothing left to release
                pass

    def _extra_metrics(self) -> dict[str, float]:
        return {"keys_available": float(self.keys.available_count())}

    def _on_new_loop(self) -> None:
        # httpx connections and asyncio primitives belong to the loop that created them
        self._client = None
        self._semaphore = None

    # ------------------------------------------------------------------ loop-bound state

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            limit = self.settings.max_concurrency
            self._client = httpx.AsyncClient(
                base_url=self.api_base,
                timeout=httpx.Timeout(self.settings.timeout_seconds),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
                follow_redirects=True,
            )
        return self._client

    @property
    def semaphore(self) -> asyncio.Semaphore:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.settings.max_concurrency)
        return self._semaphore

    # ------------------------------------------------------------------ the request loop

    async def request(self, build: RequestBuilder, parse: ResponseParser[T]) -> Fetched[T]:
        """Send one logical request with key rotation and retries; see the module docstring.

        ``build(client, key)`` is called once per attempt (so per-attempt headers such as a
        timestamp are fresh); ``key`` is None for a service without keys."""
        m = self._metrics
        retries = 0
        key_switches = 0
        last_error: str | None = None
        while True:
            slot = self.keys.acquire()
            if slot is None:
                m.unavailable += 1
                return Fetched(error=last_error or ERR_DOWN)
            index, key = slot
            retry_after: float | None = None
            async with self.semaphore:
                m.attempts += 1
                try:
                    async with asyncio.timeout(self.settings.timeout_seconds):
                        response = await self.client.send(build(self.client, key))
                except (TimeoutError, httpx.TimeoutException):
                    m.timeouts += 1
                    error = ERR_TIMEOUT
                    response = None
                except httpx.RequestError:  # connect, read, protocol, decoding errors
                    m.connection_errors += 1
                    error = ERR_CONNECTION
                    response = None

            if response is not None:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        return Fetched(value=parse(response))
                    except ResponseError as exc:
                        if exc.kind == "api":
                            m.api_errors += 1
                        else:
                            m.malformed_responses += 1
                        return Fetched(error=str(exc))
                if status == 429:
                    m.http_429 += 1
                    wait = parse_retry_after(response.headers.get("Retry-After"))
                    self.keys.bench(index, "quota exhausted (429)", wait)
                    last_error = ERR_QUOTA
                    key_switches += 1
                    if key_switches >= len(self.keys):
                        return Fetched(error=last_error)
                    continue
                if status in (401, 403):
                    m.auth_errors += 1
                    self.keys.bench(index, f"key rejected ({status})", float("inf"))
                    last_error = f"search API key rejected ({status})"
                    continue
                if status == 408 or status >= 500:
                    m.server_errors += 1
                    error = f"server error (HTTP {status})"
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                else:
                    m.http_errors += 1
                    return Fetched(error=f"request rejected (HTTP {status})")

            # a transient failure: timeout, connection error, 408 or 5xx
            if retries >= self.settings.max_retries:
                return Fetched(error=error)
            if retry_after is not None and retry_after > MAX_RETRY_AFTER_S:
                return Fetched(error=error)
            delay = retry_after
            if delay is None:
                delay = backoff_delay(retries, self._backoff_base_s, self._backoff_cap_s, self._rng)
            retries += 1
            m.retries += 1
            await asyncio.sleep(delay)
