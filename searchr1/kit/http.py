"""The one HTTP helper every plugin that talks HTTP uses: a pooled client, retries with jitter,
``Retry-After``, a per-call deadline, and errors that name the URL but never a secret.

Used by the HTTP search providers (with their own ``decide``: a 429 or a rejected key moves
to the next key), ``openai_chat`` and ``vllm_model`` (retries off: a local server that is down
should fail at once); third-party plugins should use it too (``docs/plugins.md``, "Talking
HTTP").

What one call does (:meth:`HttpClient.send`): docs/plugins.md, "Talking HTTP".
"""

from __future__ import annotations

import asyncio
import enum
import json
import random
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import tenacity

from searchr1.kit.retry import full_jitter, is_retryable_status, parse_retry_after
from searchr1.sdk import (
    RemoteAuthError,
    RemoteConnectionLost,
    RemoteError,
    RemoteHostUnknown,
    RemoteMalformed,
    RemoteRateLimited,
    RemoteRefused,
    RemoteRejected,
    RemoteServerError,
    RemoteTimeout,
    RemoteTLSError,
    RemoteUnknownModel,
    SearchR1Error,
    get_logger,
    is_secret_name,
    redact_text,
)

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
    ``"status"`` (then ``status`` and ``response`` are set); ``url`` has no query string;
    ``failure`` the class of the failure (:func:`classify`)."""

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
        failure: type[RemoteError] | None = None,
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
        if failure is None:
            failure = status_class(self.status) if self.status else RemoteConnectionLost
        self.failure = RemoteTimeout if kind == "timeout" else failure
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        super().__init__(f"{method} {url} failed after {tries}: {reason}")


class HttpGaveUp(HttpError):
    """Transient failures outlasted the retries, the deadline or the ``Retry-After`` cap."""

    #: the ``Retry-After`` of the last answer, in seconds (None: it sent none)
    retry_after: float | None = None


E = TypeVar("E", bound=HttpError)


class HttpRejected(HttpError):
    """A status that retrying cannot fix (most 4xx), or one the caller's ``decide`` refused."""


class WrongEventLoop(RuntimeError):
    """An object whose connections, futures or tasks belong to one event loop was used from
    another (a plugin instance lives in the loop of the command that made it)."""


def bound_loop(loop: asyncio.AbstractEventLoop | None, what: str) -> asyncio.AbstractEventLoop:
    """The running event loop, which must be ``loop`` when that is set: ``what`` (e.g. "the
    HTTP client of http://host:8000") was first used in ``loop`` and belongs to it alone.
    Raises :class:`WrongEventLoop` naming ``what`` otherwise."""
    running = asyncio.get_running_loop()
    if loop is not None and running is not loop:
        raise WrongEventLoop(
            f"{what} was first used in another event loop, and one client belongs to one "
            "event loop (its connections, futures and tasks live there): make it in the loop "
            "that uses it, and run a command in one loop (one asyncio.run)"
        )
    return running


class HttpClient:
    """A pooled, retrying HTTP client for one plugin instance; see the module docstring.

    ``base_url`` is prefixed to relative request URLs; ``headers`` go with every request
    (their values never appear in errors); ``timeout`` is httpx's per-phase timeout
    (connect, read, write, pool), a number or an ``httpx.Timeout``; ``name`` says what the
    client is in a :class:`WrongEventLoop` error (default: its ``base_url``)."""

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
        name: str = "",
    ):
        self.base_url = base_url.rstrip("/")
        self.name = name or f"the HTTP client of {safe_url(self.base_url) or 'absolute URLs'}"
        self.policy = policy or RetryPolicy()
        self._max_connections = max_connections
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._trust_env = trust_env
        self._follow_redirects = follow_redirects
        self._backoff = full_jitter(self.policy.backoff_base_s, self.policy.backoff_cap_s, rng)
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    def _pool(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The pool and its slots, made on the first call in the loop this client belongs to."""
        self._loop = bound_loop(self._loop, self.name)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_connections)
        if self._client is None:
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
        return self._client, self._slots

    async def aclose(self) -> None:
        """Close the pool, in the loop it belongs to (a later call in that loop opens a new
        one)."""
        if self._client is None:
            return
        self._loop = bound_loop(self._loop, self.name)
        client, self._client = self._client, None
        await client.aclose()

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
        return await _Call(self, build, decide, on_event).run()


class _Call:
    """One :meth:`HttpClient.send`: tries, each sending (again at once on Verdict.AGAIN) until
    a response is accepted or rejected, retried by tenacity while a try raises HttpGaveUp."""

    def __init__(
        self,
        client: HttpClient,
        build: RequestBuilder,
        decide: Callable[[httpx.Response], Verdict],
        on_event: EventHook | None,
    ) -> None:
        self.client, self.build, self.decide, self.policy = client, build, decide, client.policy
        self.emit = on_event or (lambda _event, _seconds: None)
        self.loop = asyncio.get_running_loop()
        deadline_s = self.policy.deadline_s
        self.deadline = None if deadline_s is None else self.loop.time() + deadline_s
        self.attempts = 0

    async def run(self) -> httpx.Response:
        policy = self.policy
        # a server asking for a longer wait than this client's cap ends the call at once
        stop = tenacity.stop_after_attempt(policy.max_retries + 1) | (
            lambda state: (self.last(state).retry_after or 0.0) > policy.max_retry_after_s
        )
        if policy.deadline_s is not None:
            stop |= tenacity.stop_before_delay(policy.deadline_s)
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(HttpGaveUp),
            wait=self.wait,
            stop=stop,
            before_sleep=self.before_sleep,
            retry_error_callback=self.give_up,
        )
        return await retrying(self.attempt)

    async def attempt(self) -> httpx.Response:
        """One try of the retry loop: sends (again at once on Verdict.AGAIN) until a
        response is accepted or rejected, or a transient failure raises HttpGaveUp (which
        the loop retries)."""
        while True:
            client, slots = self.client._pool()
            request = self.build(client)
            self.attempts += 1
            async with slots:
                response = await self._send(client, request)
            verdict = self.decide(response)
            if verdict is Verdict.ACCEPT:
                return response
            if verdict is Verdict.AGAIN:
                continue
            reason = f"HTTP {response.status_code}{_excerpt(response, request)}"
            if verdict is Verdict.REJECT:
                raise _error(
                    HttpRejected, request, self.attempts, reason, "status", response=response
                )
            error = _error(HttpGaveUp, request, self.attempts, reason, "status", response=response)
            error.retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise error

    async def _send(self, client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
        """Send once within the attempt's budget; a timeout or transport error is HttpGaveUp."""
        self.emit("attempt", 0.0)
        try:
            async with asyncio.timeout(_attempt_budget(self.policy, self.deadline, self.loop)):
                return await client.send(request)
        except (TimeoutError, httpx.TimeoutException) as exc:
            self.emit("timeout", 0.0)
            cause = type(exc).__name__
            raise _error(
                HttpGaveUp, request, self.attempts, f"timed out ({cause})", "timeout", cause=cause
            ) from exc
        except httpx.RequestError as exc:  # connect, read, protocol, decoding errors
            self.emit("connection_error", 0.0)
            cause = type(exc).__name__
            reason = f"connection error ({cause}: {_scrub(str(exc), request)})"
            raise _error(
                HttpGaveUp, request, self.attempts, reason, "connection", cause=cause,
                failure=classify(exc),
            ) from exc  # fmt: skip

    @staticmethod
    def last(state: tenacity.RetryCallState) -> HttpGaveUp:
        error = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(error, HttpGaveUp)  # the loop retries nothing else
        return error

    def wait(self, state: tenacity.RetryCallState) -> float:
        """The server's ``Retry-After`` when it sent one, else the jittered backoff."""
        retry_after = self.last(state).retry_after
        return self.client._backoff(state) if retry_after is None else retry_after

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        self.emit("retry", state.upcoming_sleep)
        get_logger().debug(
            "http_retry", url=self.last(state).url, attempt=self.attempts,
            reason=self.last(state).reason, delay_s=round(state.upcoming_sleep, 3),
        )  # fmt: skip

    def give_up(self, state: tenacity.RetryCallState) -> httpx.Response:
        """Raise the last HttpGaveUp, saying which ``stop`` ended the call when it was not
        the number of retries."""
        error, policy = self.last(state), self.policy
        if state.attempt_number > policy.max_retries:
            raise error
        asked = error.retry_after
        if asked is not None and asked > policy.max_retry_after_s:
            why = (
                f"; the server asked to wait {asked:g} s (Retry-After), more than "
                f"the {policy.max_retry_after_s:g} s this client waits"
            )
        else:
            why = f"; a retry would pass the {policy.deadline_s:g} s deadline"
        raise HttpGaveUp(
            error.method, error.url, error.attempts, error.reason + why, kind=error.kind,
            response=error.response, cause=error.cause, failure=error.failure,
        )  # fmt: skip


def _error(
    cls: type[E], request: httpx.Request, attempts: int, reason: str, kind: str, **how: Any
) -> E:
    """A ``cls`` for ``request`` (its URL made safe); ``how``: HttpError's keyword arguments."""
    return cls(request.method, safe_url(request.url), attempts, reason, kind=kind, **how)


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


# --------------------------------------------------------------------------- failure classes

#: stable error codes (not messages) that Tinker-shaped SDKs put on their exceptions
_CODE_CLASSES: dict[str, type[RemoteError]] = {
    "unauthorized": RemoteAuthError,
    "forbidden": RemoteAuthError,
    "api_key_expired": RemoteAuthError,
    "api_key_revoked": RemoteAuthError,
    "api_key_disabled": RemoteAuthError,
    "model_not_found": RemoteUnknownModel,
    "too_many_requests": RemoteRateLimited,
    "control.invalid_response": RemoteMalformed,
    "actor.invalid_response": RemoteMalformed,
}


def status_class(status: int) -> type[RemoteError]:
    """The class of an HTTP error status: 401/403 auth, 404 unknown model (or path), 408 a
    timeout, 429 rate limit, 5xx server error, any other 4xx rejected."""
    if status in (401, 403):
        return RemoteAuthError
    if status == 404:
        return RemoteUnknownModel
    if status == 408:
        return RemoteTimeout
    if status == 429:
        return RemoteRateLimited
    return RemoteServerError if status >= 500 else RemoteRejected


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (an SDK that wraps an
    ``httpx`` error ``from None`` still keeps it as the context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def status_of(exc: BaseException) -> int:
    """The HTTP status an exception carries (``status_code``, or its ``response``'s); 0 if none."""
    for attr in ("status_code", "status"):
        status = getattr(exc, attr, None)
        if isinstance(status, int) and status >= 100:
            return status
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else 0


def classify(exc: BaseException) -> type[RemoteError] | None:
    """The class of a remote failure (None: not one). Read off types and numbers only: the
    socket error under the exception (DNS, refused, TLS), its HTTP status or an SDK's stable
    error code, a timeout or a broken connection, an answer that does not parse."""
    if isinstance(exc, HttpError):
        return exc.failure
    if isinstance(exc, RemoteError):
        from searchr1.sdk import REMOTE_FAILURES

        return REMOTE_FAILURES.get(exc.failure, type(exc))
    chain = list(_causes(exc))
    for e in chain:
        if isinstance(e, socket.gaierror):
            return RemoteHostUnknown
        if isinstance(e, ssl.SSLError):
            return RemoteTLSError
        if isinstance(e, ConnectionRefusedError):
            return RemoteRefused
    for e in chain:
        code = getattr(e, "code", None)
        if isinstance(code, str) and code in _CODE_CLASSES:
            return _CODE_CLASSES[code]
        status = status_of(e)
        if status >= 400:
            return status_class(status)
    for e in chain:
        if isinstance(e, TimeoutError | httpx.TimeoutException):
            return RemoteTimeout
        if isinstance(e, ConnectionError | httpx.TransportError):
            return RemoteConnectionLost
        if isinstance(e, json.JSONDecodeError | httpx.DecodingError):
            return RemoteMalformed
    return None


def probe(url: str, timeout_s: float) -> type[RemoteError]:
    """The class of a failure whose exception lost its cause (an SDK that re-raises its
    transport error ``from None`` across threads), found by trying the address once more
    ourselves: DNS, refused, TLS or a timeout as :func:`classify` reads them; an address that
    answers means the service itself failed (RemoteServerError)."""
    parts = urlsplit(url)
    try:
        with httpx.Client(timeout=timeout_s, trust_env=True) as client:
            client.head(urlunsplit((parts.scheme, parts.netloc, "/", "", "")))  # any answer will do
    except httpx.HTTPError as exc:
        return classify(exc) or RemoteConnectionLost
    return RemoteServerError


def retry_after_of(exc: BaseException) -> float | None:
    """The ``Retry-After`` of the answer behind ``exc`` (seconds), if it had one."""
    for e in _causes(exc):
        response = getattr(e, "response", None)
        headers = getattr(response, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            seconds = parse_retry_after(headers.get("Retry-After"))
            if seconds is not None:
                return seconds
    return None


@dataclass
class Channel:
    """One remote service as a person is told about it: built once by the plugin that talks
    to it, from its settings, and used for every failure and for the first contact."""

    #: what the service is, e.g. "the model service of provider 'taotoken'"
    service: str
    #: its address (made safe: no query string, no user info)
    url: str
    #: the setting that holds the address, e.g. "model.api_base"
    address: str
    #: the variable or setting that holds the key ("" when the service takes none)
    key: str = ""
    #: the model asked for, named when the service does not know it, and its setting
    model: str = ""
    model_setting: str = "[model] base_model"
    #: seconds one request may take, and the setting that says so
    timeout_s: float | None = None
    timeout_setting: str = ""
    #: how failures are retried, e.g. "up to 3 retries ([search] max_retries)"
    retries: str = ""
    _announced: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.url = safe_url(self.url)

    def announce(self) -> None:
        """Log, on first contact only, what is awaited and for how long (``remote_connecting``,
        an event: stdout stays JSON when piped)."""
        if self._announced:
            return
        self._announced = True
        wait = [f"timeout {self.timeout_s:g} s a request"] if self.timeout_s else []
        if self.timeout_setting and wait:
            wait[0] += f" ({self.timeout_setting})"
        if self.retries:
            wait.append(self.retries)
        get_logger().info(
            "remote_connecting",
            detail=f"connecting to {self.service} at {self.url}"
            + (f" ({', '.join(wait)})" if wait else ""),
        )

    def error(self, exc: BaseException, operation: str = "") -> RemoteError:
        """``exc`` as the RemoteError of its class (a RemoteError passes unchanged; an
        exception of no known class is the service's failure): one paragraph naming this
        service's URL, the class and what to do, with no secret in it."""
        if isinstance(exc, RemoteError):
            return exc
        cls = classify(exc) or probe(self.url, min(self.timeout_s or 10.0, 10.0))
        status = exc.status if isinstance(exc, HttpError) else status_of(exc) or None
        return self._error(cls, _detail(exc), operation, status, retry_after_of(exc))

    def failed(
        self,
        cls: type[RemoteError],
        what: str,
        operation: str = "",
        status: int | None = None,
    ) -> RemoteError:
        """The RemoteError of class ``cls`` for a failure seen in an answer rather than raised
        (``what``: what is wrong, e.g. "the response is not JSON" for RemoteMalformed)."""
        return self._error(cls, f" ({redact_text(what)})", operation, status, None)

    def _error(
        self,
        cls: type[RemoteError],
        detail: str,
        operation: str,
        status: int | None,
        retry_after: float | None,
    ) -> RemoteError:
        during = f" during {operation}" if operation else ""
        message = (
            f"{self.service} at {self.url} failed{during}: {cls.summary}{detail}. "
            f"{self._fix(cls, retry_after)}"
        )
        return cls(redact_text(message), url=self.url, status=status, service=self.service)

    def _fix(self, cls: type[RemoteError], retry_after: float | None) -> str:
        """What to do: the class's ``fix`` (a connection through a proxy: the proxy's; an
        auth failure of a channel that sends no key: that it sends none), with this
        channel's facts filled in."""
        proxy = proxy_for(self.url)
        if proxy is not None and cls in _CONNECTION_CLASSES:
            # the connection is the proxy's: its failure is not the service's address
            template = _PROXY_FIXES.get(cls, _PROXY_FIX)
        elif cls is RemoteAuthError and not self.key:
            template = "The service wants a key, and this channel sends none ({address})"
        else:
            template = cls.fix
        return template.format(**self._facts(retry_after, proxy))

    def _facts(self, retry_after: float | None, proxy: tuple[str, str] | None) -> dict[str, str]:
        """The fields a failure class's ``fix`` is written with (:class:`RemoteError`)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        variable, address = proxy or ("", "")
        return {
            "host": host,
            "port": str(parts.port or (443 if parts.scheme == "https" else 80)),
            "address": self.address,
            "key": self.key,
            "other_key": f", or use another key in {self.key}" if self.key else "",
            "rerun": "then rerun (searchr1 train --resume continues a run from its last checkpoint)",
            "limit": f" within {self.timeout_s:g} s" if self.timeout_s else "",
            "raise_timeout": f"raise {self.timeout_setting}, " if self.timeout_setting else "",
            "model": f"{self.model!r} " if self.model else "",
            "model_setting": self.model_setting,
            "wait": "a while" if retry_after is None else f"{retry_after:g} s (its Retry-After)",
            "variable": variable,
            "proxy": address,
            "direct": f"unset it, or add {host} to NO_PROXY, to connect directly",
        }


#: what to do when a connection through a proxy fails, by class (others: :data:`_PROXY_FIX`)
_PROXY_FIXES: dict[type[RemoteError], str] = {
    RemoteHostUnknown: (
        "The proxy {proxy} ({variable}) does not resolve (DNS): fix its host name in "
        "{variable}, or {direct}"
    ),
    RemoteRefused: (
        "Nothing listens at the proxy {proxy} ({variable}): start it or fix {variable}, or "
        "{direct}; {rerun}"
    ),
}
_PROXY_FIX = (
    "The requests go through the proxy {proxy} ({variable}), which may be what failed (a proxy "
    "that wants credentials, refuses {host}, intercepts TLS or does not answer): check "
    "{variable}, or {direct}; {rerun}"
)


#: the failures of making the connection: through a proxy, the proxy's
_CONNECTION_CLASSES = (
    RemoteHostUnknown,
    RemoteRefused,
    RemoteTLSError,
    RemoteConnectionLost,
    RemoteTimeout,
)


def proxy_for(url: str) -> tuple[str, str] | None:
    """``(variable, proxy address without credentials)`` of the environment's proxy that
    ``url`` goes through (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``,
    as httpx and the SDKs read them), or None when it connects directly."""
    import os
    import urllib.request

    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not parts.hostname or urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    for scheme in (parts.scheme, "all"):
        if proxies.get(scheme):
            names = (f"{scheme.upper()}_PROXY", f"{scheme}_proxy")
            variable = next((n for n in names if os.environ.get(n)), names[0])
            return variable, safe_url(proxies[scheme])
    return None


def _detail(exc: BaseException) -> str:
    """`` (what the failure said)``: an HttpError's reason and attempts, else the exception's
    own first line (an SDK's ``message`` without its appended hints)."""
    if isinstance(exc, HttpError):
        tries = "1 attempt" if exc.attempts == 1 else f"{exc.attempts} attempts"
        return f" ({exc.method} {exc.url}: {exc.reason}, {tries})"
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    text = text.splitlines()[0][:300] if text.strip() else ""
    status = status_of(exc)
    said = ": ".join(p for p in (f"HTTP {status}" if status else "", text) if p)
    return f" ({type(exc).__name__}: {said})" if said else f" ({type(exc).__name__})"
