"""``searchr1.kit.http``, the HTTP helper every HTTP plugin uses, against a real loopback
server that answers from a script and counts the TCP connections it accepted: retries with
jitter, ``Retry-After`` (seconds and HTTP dates, measured), connection reuse, the deadline,
the give-up and reject paths, and errors that name the URL but no secret."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from offline import closed_port

from searchr1.core.errors import SearchR1Error
from searchr1.kit.http import (
    HttpClient,
    HttpError,
    HttpGaveUp,
    HttpRejected,
    RetryPolicy,
    WrongEventLoop,
    safe_url,
)

SECRET = "sk-live-0123456789abcdef"
FAST = RetryPolicy(max_retries=3, backoff_base_s=0.01, backoff_cap_s=0.05, attempt_timeout_s=5)


class ScriptedServer(ThreadingHTTPServer):
    """Answers each request with the next ``(status, headers, body, delay_s)`` of ``script``
    (then 200 ``{"ok": true}``); records the arrival time of every request and counts the
    connections it accepted."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: deque[tuple[int, dict[str, str], str, float]] = deque()
        self.arrivals: list[float] = []
        self.connections = 0
        self.lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        with self.lock:
            self.connections += 1
        return super().get_request()

    def queue(self, status: int, times: int = 1, body: str = "", delay_s: float = 0.0, **headers):
        headers = {k.replace("_", "-"): v for k, v in headers.items()}
        self.script.extend([(status, headers, body, delay_s)] * times)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: ScriptedServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        srv = self.server
        with srv.lock:
            srv.arrivals.append(time.monotonic())
            step = srv.script.popleft() if srv.script else (200, {}, '{"ok": true}', 0.0)
        status, headers, body, delay_s = step
        if delay_s:
            time.sleep(delay_s)
        data = body.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def call(client: HttpClient, n: int = 1, path: str = "/v1/thing", **kwargs) -> list[Any]:
    """``n`` sequential POSTs in one event loop; the results (responses or errors)."""

    async def go() -> list[Any]:
        out: list[Any] = []
        try:
            for _ in range(n):
                try:
                    out.append(await client.request("POST", path, json={"q": 1}, **kwargs))
                except HttpError as exc:
                    out.append(exc)
        finally:
            await client.aclose()
        return out

    return asyncio.run(go())


def test_requests_of_one_client_reuse_one_connection(server) -> None:
    responses = call(HttpClient(server.url, policy=FAST), n=10)
    assert [r.status_code for r in responses] == [200] * 10
    assert server.connections == 1

    async def concurrent() -> list[httpx.Response]:
        client = HttpClient(server.url, policy=FAST, max_connections=2)
        try:
            return await asyncio.gather(*(client.request("GET", "/x") for _ in range(12)))
        finally:
            await client.aclose()

    server.connections = 0
    server.queue(200, times=12, body="{}", delay_s=0.05)  # slow enough to overlap
    assert len(asyncio.run(concurrent())) == 12
    assert server.connections == 2  # the pool's limit, and reused


def test_a_client_belongs_to_the_event_loop_of_its_first_call(server, loop) -> None:
    client = HttpClient(server.url, policy=FAST)
    for _ in range(2):  # calls in the one loop share its pool
        assert loop.run(client.request("GET", "/x")).status_code == 200
    one_loop = "was first used in another event loop, and one client belongs to one event loop"
    with pytest.raises(WrongEventLoop, match=rf"the HTTP client of {server.url} {one_loop}"):
        asyncio.run(client.request("GET", "/x"))  # an error, not a second pool
    with pytest.raises(RuntimeError, match=one_loop):  # closing is done in its loop too
        asyncio.run(client.aclose())
    assert len(server.arrivals) == 2 and server.connections == 1
    loop.run(client.aclose())
    assert loop.run(client.request("GET", "/x")).status_code == 200  # reopened in its loop
    loop.run(client.aclose())
    assert server.connections == 2


def test_429_waits_for_retry_after_in_seconds(server) -> None:
    server.queue(429, retry_after="1")
    start = time.monotonic()
    (response,) = call(HttpClient(server.url, policy=FAST))
    assert response.status_code == 200 and len(server.arrivals) == 2
    # the backoff alone would wait <= 0.05 s: the second attempt came after the asked second
    assert 1.0 <= server.gaps()[0] < 2.5
    assert time.monotonic() - start >= 1.0


def test_retry_after_as_an_http_date_is_honoured(server) -> None:
    date = int(time.time() + 2)  # the header has one-second resolution
    server.queue(503, retry_after=formatdate(date, usegmt=True))
    (response,) = call(HttpClient(server.url, policy=FAST))
    assert response.status_code == 200
    # the retry waited for the date (the backoff alone would wait <= 0.05 s), and not past it
    assert time.time() >= date and server.gaps()[0] < 3.0


def test_a_retry_after_over_the_cap_fails_at_once(server) -> None:
    server.queue(429, retry_after="120")
    start = time.monotonic()
    (error,) = call(HttpClient(server.url, policy=FAST))
    assert isinstance(error, HttpGaveUp) and error.status == 429
    assert "asked to wait 120 s (Retry-After), more than the 30 s" in str(error)
    assert len(server.arrivals) == 1 and time.monotonic() - start < 1.0


def test_5xx_are_retried_then_succeed(server) -> None:
    for status in (500, 502, 503):
        server.queue(status)
    events: list[tuple[str, float]] = []

    async def go() -> httpx.Response:
        client = HttpClient(server.url, policy=FAST)
        try:
            return await client.send(
                lambda c: c.build_request("GET", "/x"), on_event=lambda e, s: events.append((e, s))
            )
        finally:
            await client.aclose()

    assert asyncio.run(go()).status_code == 200
    assert len(server.arrivals) == 4
    assert [e for e, _ in events].count("attempt") == 4
    assert [e for e, _ in events].count("retry") == 3


def retry_delays(server: ScriptedServer, seed: int) -> list[float]:
    server.queue(503, times=5)
    delays: list[float] = []
    policy = RetryPolicy(max_retries=4, backoff_base_s=0.02, backoff_cap_s=1.0)

    async def go() -> None:
        client = HttpClient(server.url, policy=policy, rng=random.Random(seed))
        try:
            await client.send(
                lambda c: c.build_request("GET", "/x"),
                on_event=lambda e, s: delays.append(s) if e == "retry" else None,
            )
        finally:
            await client.aclose()

    with pytest.raises(HttpGaveUp, match="after 5 attempts: HTTP 503"):
        asyncio.run(go())
    return delays


def test_backoff_is_exponential_with_full_jitter(server) -> None:
    first = retry_delays(server, seed=1)
    gaps = server.gaps()
    assert len(first) == 4
    for retry, delay in enumerate(first):
        assert 0.0 <= delay <= 0.02 * 2**retry
    # the server saw the waits: each gap at least the delay drawn
    assert all(gap >= delay - 0.005 for gap, delay in zip(gaps, first, strict=True))
    server.arrivals.clear()
    second = retry_delays(server, seed=2)
    assert first != second  # another client (seed) waits differently
    assert len(set(first)) == 4  # and one client's waits differ from retry to retry
    server.arrivals.clear()
    assert retry_delays(server, seed=1) == first  # reproducible with a seeded rng


def test_giving_up_names_the_url_and_the_attempts(server) -> None:
    server.queue(503, times=3, body='{"error": "overloaded"}')
    policy = RetryPolicy(max_retries=2, backoff_base_s=0.01)
    (error,) = call(HttpClient(server.url, policy=policy), path="/v1/thing?page=2")
    assert isinstance(error, HttpGaveUp) and isinstance(error, SearchR1Error)
    assert str(error).startswith(f"POST {server.url}/v1/thing failed after 3 attempts: HTTP 503")
    assert "overloaded" in str(error) and "page=2" not in str(error)
    assert (error.attempts, error.kind, error.status) == (3, "status", 503)
    assert len(server.arrivals) == 3


@pytest.mark.parametrize("status", [400, 404, 422])
def test_other_4xx_fail_at_once(server, status) -> None:
    server.queue(status, body='{"error": "bad"}', retry_after="0")
    (error,) = call(HttpClient(server.url, policy=FAST))
    assert isinstance(error, HttpRejected)
    assert f"failed after 1 attempt: HTTP {status}" in str(error)
    assert len(server.arrivals) == 1


def test_secrets_never_reach_the_error(server) -> None:
    echo = f'{{"error": "key Bearer {SECRET} invalid, token={SECRET}2, pw hunter22"}}'
    server.queue(400, body=echo)
    base = server.url.replace("http://", "http://user:hunter22@")
    client = HttpClient(base, policy=FAST, headers={"Authorization": f"Bearer {SECRET}"})
    (error,) = call(client, path=f"/v1/thing?api_key={SECRET}2")
    text = str(error)
    assert SECRET not in text and "hunter22" not in text and "user:" not in text
    assert text.startswith(f"POST {server.url}/v1/thing failed after 1 attempt: HTTP 400")
    assert "***" in text  # the echo was cut, not dropped

    # a closed port: a connection error
    client = HttpClient(f"http://127.0.0.1:{closed_port()}", policy=RetryPolicy(max_retries=1))
    (error,) = call(client, path=f"/x?key={SECRET}")
    assert isinstance(error, HttpGaveUp) and error.kind == "connection"
    assert "after 2 attempts: connection error" in str(error) and SECRET not in str(error)


def test_a_slow_attempt_times_out_and_is_retried(server) -> None:
    server.queue(200, body="{}", delay_s=1.0)
    policy = RetryPolicy(max_retries=1, backoff_base_s=0.01, attempt_timeout_s=0.3)
    (response,) = call(HttpClient(server.url, policy=policy))
    assert response.status_code == 200 and len(server.arrivals) == 2
    # the retry went out before the slow answer's second was up: the attempt was cut at 0.3 s
    assert server.gaps()[0] < 1.0


def test_the_deadline_bounds_the_whole_call(server) -> None:
    server.queue(503, times=50, retry_after="0.3")
    policy = RetryPolicy(max_retries=50, attempt_timeout_s=5, deadline_s=1.0)
    start = time.monotonic()
    (error,) = call(HttpClient(server.url, policy=policy))
    took = time.monotonic() - start
    assert isinstance(error, HttpGaveUp) and "would pass the 1 s deadline" in str(error)
    # Attempts start >= 0.3 s apart, so at most 4 fit in 1 s; it gives up once the next
    # wait would pass 1 s (so not before 0.6 s). Without the deadline it would take 15 s:
    # the upper bound leaves a loaded machine room for slow attempts.
    assert 0.6 <= took < 3.0 and 2 <= len(server.arrivals) <= 4


def test_the_deadline_cuts_a_stalled_attempt(server) -> None:
    # A server of its own: an attempt the previous call abandoned at its deadline can still
    # reach a shared server late and take this script's entry.
    server.queue(200, body="{}", delay_s=5.0)
    start = time.monotonic()
    (error,) = call(HttpClient(server.url, policy=RetryPolicy(max_retries=5, deadline_s=0.5)))
    assert isinstance(error, HttpGaveUp) and error.kind == "timeout"
    assert time.monotonic() - start < 3.0  # the answer would take 5 s


def test_safe_url_drops_user_info_query_and_fragment() -> None:
    assert safe_url("https://u:p@example.com:8443/a/b?key=x#f") == "https://example.com:8443/a/b"
    assert safe_url("http://[::1]:8000/retrieve") == "http://[::1]:8000/retrieve"


def test_the_documented_example_searches_through_a_503(server) -> None:
    """docs/plugins.md "Talking HTTP": its example plugin retries and parses."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    section = re.search(r"^## Talking HTTP\n(.*?)(?=^## |\Z)", doc, flags=re.M | re.S)
    assert section, "docs/plugins.md has no '## Talking HTTP' section"
    namespace: dict[str, Any] = {}
    code = re.findall(r"```python\n(.*?)```", section.group(1), flags=re.S)[-1]
    exec(compile(code, "docs/plugins.md#talking-http", "exec"), namespace)
    server.queue(503)
    server.queue(200, body=json.dumps({"hits": [{"title": "France", "text": "Paris."}] * 3}))
    provider = namespace["JsonSearch"](server.url)

    async def go() -> list[Any]:
        try:
            return [await provider.search("capital of France", 2)]
        finally:
            await provider.aclose()

    (response,) = asyncio.run(go())
    assert response.ok and [r.title for r in response.results] == ["France", "France"]
    assert len(server.arrivals) == 2


def test_a_connection_slot_is_held_per_attempt_not_while_waiting(server) -> None:
    """With one connection, a call waiting 0.5 s to retry lets another call through meanwhile."""
    server.queue(503, retry_after="0.5")
    finished: list[str] = []

    async def go() -> None:
        client = HttpClient(server.url, policy=FAST, max_connections=1)

        async def one(name: str) -> None:
            await client.request("GET", f"/{name}")
            finished.append(name)

        try:
            first = asyncio.create_task(one("first"))
            await asyncio.sleep(0.1)  # the first got its 503 and sleeps
            await asyncio.gather(first, one("second"))
        finally:
            await client.aclose()

    asyncio.run(go())
    assert finished == ["second", "first"] and len(server.arrivals) == 3


class _ProxyWanting407(BaseHTTPRequestHandler):
    """A proxy that wants credentials: every CONNECT is answered 407."""

    def do_CONNECT(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(407)
        self.send_header("Proxy-Authenticate", 'Basic realm="corp"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("proxy", ["closed port", "unknown host", "wants credentials"])
def test_a_failing_proxy_is_named_not_the_services_address(monkeypatch, proxy: str) -> None:
    """Through ``HTTPS_PROXY`` the connection is the proxy's: a proxy that is down, does not
    resolve or refuses is said as the proxy's (its address without credentials, the variable,
    NO_PROXY), never as the service's port or host name; with the service in NO_PROXY the
    direct connection's own failure is said as before."""
    from searchr1.kit.http import Channel

    server = None
    if proxy == "closed port":
        address = f"127.0.0.1:{closed_port()}"
    elif proxy == "unknown host":
        address = "proxy.invalid:3128"
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyWanting407)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HTTPS_PROXY", f"http://corp-user:proxy-secret@{address}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = "https://search.example.test/api"
    channel = Channel(service="the search service", url=url, address="search.api_base")

    def fail() -> str:
        client = HttpClient(policy=RetryPolicy(max_retries=0, attempt_timeout_s=5))
        with pytest.raises(HttpGaveUp) as caught:
            asyncio.run(client.send(lambda c: c.build_request("GET", url)))
        return str(channel.error(caught.value))

    try:
        said = fail()
        assert f"http://{address} (HTTPS_PROXY)" in said, said
        assert "add search.example.test to NO_PROXY" in said
        assert "proxy-secret" not in said and "corp-user" not in said
        assert "port 443 of search.example.test" not in said
        assert "host name 'search.example.test'" not in said
        if proxy == "wants credentials":
            assert "407 Proxy Authentication Required" in said
        monkeypatch.setenv("NO_PROXY", "search.example.test")
        direct = fail()  # no DNS for it here, nor anywhere (.test is reserved)
        assert "Check the host name 'search.example.test' in search.api_base" in direct, direct
        assert "PROXY (" not in direct
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
