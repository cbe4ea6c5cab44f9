"""The one HTTP helper every plugin that talks HTTP uses: a pooled client, retries with jitter,
``Retry-After``, a per-call deadline, and errors that name the URL but never a secret.

Used by the HTTP search providers (with their own ``decide``: a 429 or a rejected key moves
to the next key), ``openai_chat`` and ``vllm_model`` (retries off: a local server that is down
should fail at once); third-party plugins should use it too (``docs/plugins.md``, "Talking
HTTP").

What one call does (:meth:`HttpClient.send`):

* sends on an ``httpx.AsyncClient`` kept per event loop, so one plugin instance reuses its
  keep-alive connections (a new loop gets a new pool: connections belong to their loop);
  at most ``max_connections`` attempts run at once, each holding a slot of a per-loop
  semaphore while it runs and never while it waits to retry (a call queued behind them
  waits for a slot, not in the pool, where httpx's pool timeout would end it);
* bounds each attempt by :attr:`RetryPolicy.attempt_timeout_s` end to end, and the whole call,
  sleeps included, by :attr:`RetryPolicy.deadline_s`;
* retries timeouts, connection errors and the statuses of
  :func:`~searchr1.kit.retry.is_retryable_status` (408, 409, 429, 5xx) up to
  :attr:`RetryPolicy.max_retries` times, waiting :func:`~searchr1.kit.retry.backoff_delay`
  (exponential, "full jitter": uniform between 0 and the exponential ceiling, so callers that
  failed together do not come back together) or, when the server sent one, ``Retry-After``
  (seconds or an HTTP date, :func:`~searchr1.kit.retry.parse_retry_after`); a server that
  asks for more than :attr:`RetryPolicy.max_retry_after_s`, or a wait that would pass the
  deadline, ends the call at once instead of stalling it;
* fails at once on any other status (:class:`HttpRejected`), and with :class:`HttpGaveUp`
  when the retries, the deadline or the server's patience ran out. Both say the method, the
  URL without its query string or user info, the number of attempts and the last failure;
  header values and query values that look like credentials are cut out of the body excerpt,
  as are the secrets registered with :mod:`searchr1.core.secrets`.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from searchr1.core.errors import SearchR1Error
from searchr1.core.logs import get_logger
from searchr1.core.secrets import is_secret_name, redact_text
from searchr1.kit.retry import backoff_delay, is_retryable_status, parse_retry_after

#: builds the request of one attempt (called again for every attempt, so per-attempt headers
#: such as a timestamp or the next key of a pool are fresh)
RequestBuilder = Callable[[httpx.AsyncClient], httpx.Request]
#: told ``("attempt", 0)``, ``("timeout", 0)``, ``("connection_error", 0)`` and
#: ``("retry", delay_s)`` as they happen (metrics)
EventHook = Callable[[str, float], None]


class Verdict(enum.Enum):
    """What :meth:`HttpClient.send` does with a response (the ``decide`` function's answer)."""

    #: hand the response to the caller
    ACCEPT = "accept"
    #: a transient failure: wait (backoff or ``Retry-After``) and retry, counting a retry
    RETRY = "retry"
    #: send again at once, not counted as a retry (e.g. with the next key of a pool); the
    #: caller bounds how often it answers this
    AGAIN = "again"
    #: stop now with :class:`HttpRejected`
    REJECT = "reject"


def default_decide(response: httpx.Response) -> Verdict:
    """2xx accepted, :func:`is_retryable_status` retried, anything else rejected."""
    status = response.status_code
    if 200 <= status < 300:
        return Verdict.ACCEPT
    return Verdict.RETRY if is_retryable_status(status) else Verdict.REJECT


def accept_any(response: httpx.Response) -> Verdict:
    """Every answer goes to the caller (who reads the status itself); only timeouts and
    connection errors are retried."""
    return Verdict.ACCEPT


def safe_url(url: str | httpx.URL) -> str:
    """``url`` without user info, query string or fragment: what an error may show."""
    parts = urlsplit(str(url))
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call tries. Built by each plugin from its settings."""

    #: retries after the first attempt (0: one attempt only)
    max_retries: int = 3
    #: backoff ceiling of the first retry; doubles per retry up to ``backoff_cap_s``
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 8.0
    #: a server asking to wait longer than this ends the call (a rollout must not stall)
    max_retry_after_s: float = 30.0
    #: bound of one attempt, connect to last body byte; None: only httpx's own timeouts
    attempt_timeout_s: float | None = 30.0
    #: bound of the whole call, waits included; None: bounded by the retries only
    deadline_s: float | None = None


class HttpError(SearchR1Error):
    """A call that failed for good. ``kind`` is ``"timeout"``, ``"connection"`` or
    ``"status"`` (then ``status`` and ``response`` are set); ``url`` has no query string."""

    def __init__(
        self,
        method: str,
        url: str,
        attempts: int,
        reason: str,
        *,
        kind: str,
        response: httpx.Response | None = None,
        cause: str = "",
    ):
        self.method = method
        self.url = url
        self.attempts = attempts
        self.reason = reason
        self.kind = kind
        self.response = response
        self.status = response.status_code if response is not None else None
        #: the exception class behind a timeout or connection error (e.g. ``ConnectError``)
        self.cause = cause
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        super().__init__(f"{method} {url} failed after {tries}: {reason}")


class HttpGaveUp(HttpError):
    """Transient failures outlasted the retries, the deadline or the ``Retry-After`` cap."""


class HttpRejected(HttpError):
    """A status that retrying cannot fix (most 4xx), or one the caller's ``decide`` refused."""


class HttpClient:
    """A pooled, retrying HTTP client for one plugin instance; see the module docstring.

    ``base_url`` is prefixed to relative request URLs; ``headers`` go with every request
    (their values never appear in errors); ``timeout`` is httpx's per-phase timeout
    (connect, read, write, pool), a number or an ``httpx.Timeout``."""

    def __init__(
        self,
        base_url: str = "",
        *,
        policy: RetryPolicy | None = None,
        max_connections: int = 16,
        headers: dict[str, str] | None = None,
        timeout: float | httpx.Timeout = 30.0,
        trust_env: bool = True,
        follow_redirects: bool = False,
        rng: random.Random | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.policy = policy or RetryPolicy()
        self._max_connections = max_connections
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._trust_env = trust_env
        self._follow_redirects = follow_redirects
        self._rng = rng or random.Random()
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The pool of the running event loop (made on first use in each loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # a pool opened in another loop cannot be used (or closed) from this one
            self._loop = loop
            self._slots = asyncio.Semaphore(self._max_connections)
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._timeout,
                limits=httpx.Limits(
                    max_connections=self._max_connections,
                    max_keepalive_connections=self._max_connections,
                ),
                trust_env=self._trust_env,
                follow_redirects=self._follow_redirects,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the pool (a pool left in another, finished loop is just dropped)."""
        client, loop = self._client, self._loop
        self._client = self._loop = None
        if client is None:
            return
        try:
            if loop is asyncio.get_running_loop():
                await client.aclose()
        except RuntimeError:  # bound to a loop that is gone; nothing left to release
            pass

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        decide: Callable[[httpx.Response], Verdict] = default_decide,
    ) -> httpx.Response:
        """One call (``url`` absolute or relative to ``base_url``); see :meth:`send`.
        ``timeout`` overrides the httpx timeout for this call only."""

        def build(client: httpx.AsyncClient) -> httpx.Request:
            extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            return client.build_request(
                method, url, json=json, params=params, headers=headers, **extra
            )

        return await self.send(build, decide=decide)

    async def send(
        self,
        build: RequestBuilder,
        *,
        decide: Callable[[httpx.Response], Verdict] = default_decide,
        on_event: EventHook | None = None,
    ) -> httpx.Response:
        """Send ``build(client)`` until ``decide`` accepts a response; raise
        :class:`HttpRejected` or :class:`HttpGaveUp` otherwise. ``build`` may raise to end the
        call (its exception goes to the caller unchanged)."""
        policy = self.policy
        emit = on_event or (lambda _event, _seconds: None)
        loop = asyncio.get_running_loop()
        deadline = None if policy.deadline_s is None else loop.time() + policy.deadline_s
        attempts = retries = 0
        while True:
            client, slots = self.client, self._slots
            assert slots is not None  # made with the pool
            request = build(client)
            attempts += 1
            response: httpx.Response | None = None
            async with slots:
                emit("attempt", 0.0)
                try:
                    async with asyncio.timeout(_attempt_budget(policy, deadline, loop)):
                        response = await client.send(request)
                except (TimeoutError, httpx.TimeoutException) as exc:
                    emit("timeout", 0.0)
                    kind, cause = "timeout", type(exc).__name__
                    reason = f"timed out ({cause})"
                except httpx.RequestError as exc:  # connect, read, protocol, decoding errors
                    emit("connection_error", 0.0)
                    kind, cause = "connection", type(exc).__name__
                    reason = f"connection error ({cause}: {_scrub(str(exc), request)})"
            retry_after: float | None = None
            if response is not None:
                verdict = decide(response)
                if verdict is Verdict.ACCEPT:
                    return response
                if verdict is Verdict.AGAIN:
                    continue
                kind, cause = "status", ""
                reason = f"HTTP {response.status_code}{_excerpt(response, request)}"
                if verdict is Verdict.REJECT:
                    raise self._error(HttpRejected, request, attempts, reason, kind, response)
                retry_after = parse_retry_after(response.headers.get("Retry-After"))

            # a transient failure: timeout, connection error or a retryable status
            stop, why = retries >= policy.max_retries, ""
            if not stop and retry_after is not None and retry_after > policy.max_retry_after_s:
                stop, why = (
                    True,
                    (
                        f"; the server asked to wait {retry_after:g} s (Retry-After), more than "
                        f"the {policy.max_retry_after_s:g} s this client waits"
                    ),
                )
            delay = retry_after
            if delay is None:
                delay = backoff_delay(
                    retries, policy.backoff_base_s, policy.backoff_cap_s, self._rng
                )
            if not stop and deadline is not None and loop.time() + delay >= deadline:
                stop, why = True, f"; a retry would pass the {policy.deadline_s:g} s deadline"
            if stop:
                raise self._error(
                    HttpGaveUp, request, attempts, reason + why, kind, response, cause
                )
            retries += 1
            emit("retry", delay)
            get_logger().debug(
                "http_retry", url=safe_url(request.url), attempt=attempts, reason=reason,
                delay_s=round(delay, 3),
            )  # fmt: skip
            await asyncio.sleep(delay)

    @staticmethod
    def _error(
        cls: type[HttpError],
        request: httpx.Request,
        attempts: int,
        reason: str,
        kind: str,
        response: httpx.Response | None,
        cause: str = "",
    ) -> HttpError:
        return cls(
            request.method,
            safe_url(request.url),
            attempts,
            reason,
            kind=kind,
            response=response,
            cause=cause,
        )


def _attempt_budget(
    policy: RetryPolicy, deadline: float | None, loop: asyncio.AbstractEventLoop
) -> float | None:
    budget = policy.attempt_timeout_s
    if deadline is not None:
        left = max(0.0, deadline - loop.time())
        budget = left if budget is None else min(budget, left)
    return budget


def _excerpt(response: httpx.Response, request: httpx.Request) -> str:
    """``": <the first 200 characters of the body>"``, scrubbed, or "" for an empty body."""
    try:
        text = " ".join(response.text.split())[:200]
    except Exception:  # noqa: BLE001 - an undecodable body says nothing useful
        return ""
    return f": {_scrub(text, request)}" if text else ""


def _scrub(text: str, request: httpx.Request) -> str:
    """``text`` without the credential-like header and query values of ``request`` (a server
    that echoes the key back must not put it into our error) and registered secrets."""
    pairs = [*request.headers.items(), *request.url.params.multi_items()]
    values = [v for k, v in pairs if is_secret_name(k)]
    # the whole value and its last word (the credential of "Bearer <key>"), and the user info
    secrets = {p for v in values for p in (v.strip(), *v.split()[-1:])}
    secrets |= {request.url.userinfo.decode(errors="replace"), request.url.password or ""}
    return redact_text(text, secrets)
