"""The one reliability layer for every HTTP search provider.

A provider plugin subclasses :class:`HttpSearchProvider`, implements ``_fetch`` and, inside it,
calls :meth:`HttpSearchProvider.request` with two small functions: one that builds the
``httpx.Request`` for a given key, one that parses a 2xx response (raising
:class:`ResponseError` for an unusable body). ``request`` sends through the provider's
:class:`~searchr1.kit.http.HttpClient` (the HTTP helper every plugin shares: pooled
connections, retries with jitter, ``Retry-After``) and adds key rotation and benching (:mod:`.keys`), a
concurrency limit and per-attempt metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx

from searchr1.kit.http import Channel, HttpClient, HttpError, RetryPolicy, Verdict, safe_url
from searchr1.kit.retry import parse_retry_after
from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.keys import KeyPool
from searchr1.sdk import (
    RemoteAuthError,
    RemoteError,
    RemoteMalformed,
    RemoteRejected,
    SearchConfig,
    get_logger,
    redact_text,
)

T = TypeVar("T")

#: model-readable errors (the observation a trajectory sees when a search fails)
ERR_QUOTA = "quota exhausted (429)"
ERR_DOWN = "search unavailable (every API key is benched)"
ERR_TIMEOUT = "timeout"
ERR_CONNECTION = "connection error"

#: a server asking us to wait longer than this is treated as down for this call (no retry):
#: a rollout cannot stall for minutes on one search
MAX_RETRY_AFTER_S = 30.0


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
    #: the classified failure behind ``error`` (None on success)
    failure: RemoteError | None = None


RequestBuilder = Callable[[httpx.AsyncClient, "str | None"], httpx.Request]
ResponseParser = Callable[[httpx.Response], T]


class _NoKeyLeft(Exception):
    """Raised by the request builder when every key is benched: the call ends."""


@dataclass
class _Tries:
    """What one :meth:`HttpSearchProvider.request` call has seen so far."""

    index: int = 0
    last_error: str | None = None
    key_switches: int = 0
    #: keys whose 2xx answer could not be used
    unusable: int = 0
    parsed: object = None
    parse_error: ResponseError | None = None
    #: the 401/403 of the last rejected key
    auth_status: int = 0


#: the ``[search]`` fields this layer reads (a provider's ``reads``)
HTTP_SETTINGS = (
    "api_keys",
    "api_base",
    "timeout_seconds",
    "max_retries",
    "key_cooldown_seconds",
    "key_max_failures",
    "key_probe_seconds",
)


class HttpSearchProvider(BaseSearchProvider):
    """Key pool, retries, concurrency limit and a pooled HTTP client for one provider; see
    the module docstring."""

    http = True
    #: used when ``api_base`` is empty
    default_api_base: str = ""

    def __init__(self, settings: SearchConfig, *, backoff_base_s: float = 0.25):
        super().__init__(settings)
        self.api_base = (settings.api_base or self.default_api_base).rstrip("/")
        self.keys = KeyPool(
            settings.api_keys,
            settings.key_cooldown_seconds,
            provider=self.name,
            max_failures=settings.key_max_failures,
            probe_s=settings.key_probe_seconds,
        )
        self.http = HttpClient(
            self.api_base,
            policy=RetryPolicy(
                max_retries=settings.max_retries,
                backoff_base_s=backoff_base_s,
                max_retry_after_s=MAX_RETRY_AFTER_S,
                attempt_timeout_s=settings.timeout_seconds,
            ),
            max_connections=settings.max_concurrency,
            timeout=settings.timeout_seconds,
            follow_redirects=True,
            name=f"the HTTP client of the {self.name} search provider ({safe_url(self.api_base)})",
        )
        self.channel = Channel(
            service=f"the {self.name} search API",
            url=self.api_base,
            address="search.api_base",
            key="" if self.keys.anonymous else "search.api_keys",
            timeout_s=settings.timeout_seconds,
            timeout_setting="[search] timeout_seconds",
            retries=f"up to {settings.max_retries} retries ([search] max_retries)",
        )
        self._failures_said: set[str] = set()

    # ------------------------------------------------------------------ protocol

    def available(self) -> bool:
        """False once every key is benched for longer than a ``Retry-After`` this provider
        waits out (:data:`MAX_RETRY_AFTER_S`): the environment is down. Keys a rate limit
        benched for a few seconds are back before the next step's searches, so the guard
        does not hold a step back for them (the step's success rate still counts)."""
        return self.keys.available_count(within_s=MAX_RETRY_AFTER_S) > 0

    def decided_failure(self) -> RemoteError | None:
        """The failure no wait mends (:meth:`KeyPool.failure_for_run`): every key benched
        for the rest of the run, a rejected one making it exit 2. Else None."""
        return self.keys.failure_for_run(self.channel)

    async def aclose(self) -> None:
        await self.http.aclose()
        await super().aclose()

    def _extra_metrics(self, reset: bool) -> dict[str, float]:
        calls = self.keys.take_calls() if reset else list(self.keys.calls)
        if self.keys.anonymous:
            return {}
        out = {"keys_available": float(self.keys.available_count())}
        out.update({f"key_calls/{i}": float(n) for i, n in enumerate(calls)})
        return out

    def persistent_scope(self) -> str | None:
        """Answers of a keyed (billed) service are kept on disk, scoped by this provider's
        endpoint (its address without query string or user info, any registered secret
        masked: never a key); a service without keys is not billed and its index may change
        under the same address, so it is not."""
        if self.keys.anonymous:
            return None
        return redact_text(safe_url(self.api_base) + self.endpoint())

    def endpoint(self) -> str:
        """The path and options that decide this provider's answers (subclasses extend)."""
        return ""

    # ------------------------------------------------------------------ the request

    async def request(self, build: RequestBuilder, parse: ResponseParser[T]) -> Fetched[T]:
        """Send one logical request with key rotation and retries; see the module docstring.

        ``build(client, key)`` is called once per attempt (so per-attempt headers such as a
        timestamp are fresh); ``key`` is None for a service without keys."""
        tries = _Tries()

        def attempt(client: httpx.AsyncClient) -> httpx.Request:
            slot = self.keys.acquire()
            if slot is None:
                raise _NoKeyLeft
            tries.index, key = slot
            return build(client, key)

        self.channel.announce()
        try:
            # decide() parses the 2xx it accepts (an unusable one moves to the next key)
            await self.http.send(
                attempt,
                decide=lambda response: self._decide(response, tries, parse),
                on_event=self._count,
            )
        except _NoKeyLeft:
            self._metrics.unavailable += 1
            failure = None
            if tries.auth_status:  # every key was rejected
                failure = self.channel.failed(
                    RemoteAuthError,
                    f"HTTP {tries.auth_status} for every key",
                    status=tries.auth_status,
                )
            return self._failed(tries.last_error or ERR_DOWN, failure)
        except HttpError as exc:
            return self._failed(_model_error(exc), self.channel.error(exc))
        if tries.parse_error is not None:
            kind = RemoteMalformed if tries.parse_error.kind == "malformed" else RemoteRejected
            failure = self.channel.failed(kind, str(tries.parse_error))
            return self._failed(str(tries.parse_error), failure)
        return Fetched(value=tries.parsed)  # type: ignore[arg-type]

    def _decide(self, response: httpx.Response, tries: _Tries, parse: ResponseParser[T]) -> Verdict:
        """What an answer means for the request and for its key: a 2xx is parsed, a 429
        benches the key for its Retry-After, a 401/403 for the run, a 408/5xx is retried."""
        m, status = self._metrics, response.status_code
        if 200 <= status < 300:
            m.paid_calls += 1
            return self._parsed(response, tries, parse)
        if status == 429:
            m.http_429 += 1
            wait = parse_retry_after(response.headers.get("Retry-After"))
            self.keys.bench(tries.index, "quota exhausted (429)", wait)
            tries.last_error = ERR_QUOTA
            tries.key_switches += 1
            return Verdict.REJECT if tries.key_switches >= len(self.keys) else Verdict.AGAIN
        if status in (401, 403):
            m.auth_errors += 1
            self.keys.bench(tries.index, f"key rejected ({status})", float("inf"), rejected=status)
            tries.last_error = f"search API key rejected ({status})"
            tries.auth_status = status
            return Verdict.AGAIN  # the next key, or _NoKeyLeft when none is left
        if status == 408 or status >= 500:
            m.server_errors += 1
            return Verdict.RETRY  # the service's trouble, not the key's: no health change
        m.http_errors += 1
        return Verdict.REJECT

    def _parsed(self, response: httpx.Response, tries: _Tries, parse: ResponseParser[T]) -> Verdict:
        """Parse a 2xx into ``tries``; an unusable one (an API error, a malformed body) counts
        against its key and moves to the next key while another is available."""
        m = self._metrics
        try:
            tries.parsed, tries.parse_error = parse(response), None
        except ResponseError as exc:
            tries.parse_error = exc
            if exc.kind == "api":
                m.api_errors += 1
            else:
                m.malformed_responses += 1
            self.keys.failed(tries.index, str(exc))
            tries.unusable += 1
            tries.last_error = str(exc)
            if tries.unusable < len(self.keys) and self.keys.others_available(tries.index):
                m.key_retries += 1
                return Verdict.AGAIN  # the next key, before this counts as a failure
            return Verdict.ACCEPT
        self.keys.succeeded(tries.index)
        return Verdict.ACCEPT

    def _failed(self, error: str, failure: RemoteError | None) -> Fetched[T]:
        """A failed request's outcome; its class said in the log the first time it is seen."""
        if failure is not None and failure.failure not in self._failures_said:
            self._failures_said.add(failure.failure)
            get_logger().warning(
                "search_failed", provider=self.name, failure=failure.failure, detail=str(failure)
            )
        return Fetched(error=error, failure=failure)

    def _count(self, event: str, _seconds: float) -> None:
        m = self._metrics
        if event == "attempt":
            m.attempts += 1
        elif event == "timeout":
            m.timeouts += 1
        elif event == "connection_error":
            m.connection_errors += 1
        elif event == "retry":
            m.retries += 1


def _model_error(exc: HttpError) -> str:
    """The short error a trajectory reads (no URL, no key)."""
    if exc.kind == "timeout":
        return ERR_TIMEOUT
    if exc.kind == "connection":
        return ERR_CONNECTION
    if exc.status == 429:
        return ERR_QUOTA
    if exc.status == 408 or (exc.status or 0) >= 500:
        return f"server error (HTTP {exc.status})"
    return f"request rejected (HTTP {exc.status})"
