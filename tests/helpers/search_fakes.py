"""Loopback fake search services with fault injection, for tests and benchmarks.

One real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a thread per connection)
speaks both protocols of ``docs/protocols.md``:

* Zhihu (section 1): ``GET /api/v1/content/global_search?Query=...&Count=...`` with
  ``Authorization: Bearer <key>``;
* the Search-R1 retriever (section 2): ``POST /retrieve`` with
  ``{"queries": [...], "topk": k, "return_scores": true}``.

Faults come from a :class:`Behaviour` that a test may change while the server runs. The server
records every request (:class:`Record`: which key, which queries, what status it answered),
the most requests it held at once (``max_in_flight``) and the TCP connections it accepted
(``connections``: a client that reuses its pool opens few).

Typical use (the rollout smoke test uses the same thing for a service that is out of quota)::

    from search_fakes import Behaviour, start_fake_zhihu

    with start_fake_zhihu(Behaviour(all_status=429)) as (base_url, server):
        ...  # [search] provider = "zhihu", api_base = base_url, api_keys = "k1,k2"
        assert all(r.status == 429 for r in server.records)
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

ZHIHU_PATH = "/api/v1/content/global_search"
RETRIEVE_PATH = "/retrieve"

#: actions a Behaviour.script may hold, one consumed per request in arrival order
SCRIPT_ACTIONS = ("ok", "slow", "malformed", "wrong_shape", "code", "drop")  # or a status


@dataclass
class Behaviour:
    """What the fake answers. Precedence per request: ``all_status``, then ``key_status`` and
    ``key_action`` of the request's key, then the next ``script`` action, then a normal
    answer."""

    #: every request sleeps this long before answering (e.g. 0.05 for the benchmark)
    latency_s: float = 0.0
    #: every request is answered with this status (e.g. 429: every key out of quota)
    all_status: int | None = None
    #: key -> status answered to every request carrying that key (429, 401, 403, ...)
    key_status: dict[str, int] = field(default_factory=dict)
    #: key -> script action answered to every request carrying that key (a dead key: "code",
    #: an API error inside an HTTP 200; "malformed"; "slow"; ...)
    key_action: dict[str, str] = field(default_factory=dict)
    #: one action per request, in arrival order, then normal answers: an HTTP status as a
    #: string ("503"), "slow" (sleep ``slow_s`` first), "malformed" (not JSON),
    #: "wrong_shape" (JSON of the wrong shape), "code" (Zhihu Code != 0), "drop" (close the
    #: connection without answering), "ok"
    script: list[str] = field(default_factory=list)
    #: how long a "slow" request sleeps (make it longer than the client's timeout)
    slow_s: float = 2.0
    #: ``Retry-After`` header value sent with 429 and 5xx answers
    retry_after: str | None = None
    #: the Zhihu ``Code`` of normal answers (non-zero: an API error with HTTP 200)
    code: int = 0
    #: Zhihu ``Message``; ``{key}`` is replaced by the request's key (to test redaction)
    message: str = "success"
    #: results per query in normal answers; None = as many as asked for
    results: int | None = None
    #: share of the other requests answered with a fault drawn from ``faults`` (a soak's
    #: flaky service), by a generator seeded with ``seed``
    fault_rate: float = 0.0
    faults: tuple[str, ...] = ("slow", "503", "429", "code", "drop")
    seed: int = 0


@dataclass(frozen=True)
class Record:
    """One request the fake received."""

    path: str
    key: str | None
    queries: tuple[str, ...]
    params: dict[str, str]
    status: int  # 0 when the connection was dropped
    action: str
    started: float
    finished: float


class FakeSearchServer(ThreadingHTTPServer):
    """The server object: ``behaviour`` (mutable), ``records``, ``max_in_flight``."""

    daemon_threads = True
    request_queue_size = 256  # the benchmark opens many connections at once

    def __init__(self, behaviour: Behaviour, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.behaviour = behaviour
        self.rng = random.Random(behaviour.seed)
        self.records: list[Record] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def get_request(self) -> tuple[socket.socket, Any]:
        with self.lock:
            self.connections += 1
        return super().get_request()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def keys_served(self, status: int = 200) -> list[str | None]:
        """The key of every request answered with ``status``, in order."""
        with self.lock:
            return [r.key for r in self.records if r.status == status]

    def reset(self) -> None:
        with self.lock:
            self.records.clear()
            self.max_in_flight = 0

    def _next_action(self, key: str | None) -> str:
        b = self.behaviour
        with self.lock:
            if b.all_status is not None:
                return str(b.all_status)
            if key is not None and key in b.key_status:
                return str(b.key_status[key])
            if key is not None and key in b.key_action:
                return b.key_action[key]
            if b.script:
                return b.script.pop(0)
            if b.fault_rate and self.rng.random() < b.fault_rate:
                return self.rng.choice(b.faults)
        return "ok"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real service
    # one buffered write per answer (flushed by the stdlib after each request) and no Nagle:
    # headers and body sent as separate small segments would wait on delayed ACKs (~40 ms)
    wbufsize = -1
    disable_nagle_algorithm = True
    server: FakeSearchServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # keep test output clean

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlparse(self.path)
        if url.path != ZHIHU_PATH:
            self._send(404, b'{"error": "not found"}')
            return
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self._serve(url.path, [params.get("Query", "")], params, _int(params.get("Count"), 10))

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if url.path != RETRIEVE_PATH:
            self._send(404, b'{"error": "not found"}')
            return
        try:
            body = json.loads(raw)
            queries = [str(q) for q in body["queries"]]
            topk = int(body.get("topk", 3))
            scores = bool(body.get("return_scores", False))
        except (ValueError, KeyError, TypeError):
            self._send(400, b'{"error": "bad request"}')
            return
        params = {"topk": str(topk), "return_scores": str(scores).lower()}
        self._serve(url.path, queries, params, topk)

    # ------------------------------------------------------------------ shared

    def _serve(self, path: str, queries: list[str], params: dict[str, str], count: int) -> None:
        srv = self.server
        auth = self.headers.get("Authorization", "")
        key = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        started = time.monotonic()
        with srv.lock:
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            b = srv.behaviour
            action = srv._next_action(key)
            if b.latency_s:
                srv.stopping.wait(b.latency_s)
            if action == "slow":
                srv.stopping.wait(b.slow_s)
            answer = self._answer(action, path, queries, params, count, key)
            # recorded before answering, so a client that got the answer sees the record
            record = Record(
                path,
                key,
                tuple(queries),
                params,
                answer[0] if answer else 0,
                action,
                started,
                time.monotonic(),
            )
            with srv.lock:
                srv.records.append(record)
            if answer is None:  # "drop": close the connection without a word
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            else:
                self._send(*answer)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout): nothing to answer
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _answer(
        self,
        action: str,
        path: str,
        queries: list[str],
        params: dict[str, str],
        count: int,
        key: str | None,
    ) -> tuple[int, bytes, dict[str, str]] | None:
        """(status, body, headers) for ``action``; None to drop the connection."""
        b = self.server.behaviour
        if action.isdigit():
            status = int(action)
            headers = {}
            if b.retry_after is not None and (status == 429 or status >= 500):
                headers["Retry-After"] = b.retry_after
            return status, json.dumps({"error": f"fake {status}"}).encode(), headers
        if action == "drop":
            return None
        if action == "malformed":
            return 200, b"<html>502 Bad Gateway</html>", {}
        n = count if b.results is None else b.results
        if path == ZHIHU_PATH:
            if action == "wrong_shape":
                body: Any = {"Code": 0, "Data": {"Items": "none"}}
            else:
                code = 1001 if action == "code" else b.code
                body = _zhihu_body(queries[0], n, code, b.message.replace("{key}", key or ""))
        else:
            if action == "wrong_shape":
                body = {"result": {"oops": True}}
            else:
                body = {"result": [_retriever_hits(q, n, params) for q in queries]}
        return 200, json.dumps(body).encode(), {}

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _zhihu_body(query: str, n: int, code: int, message: str) -> dict[str, Any]:
    if code != 0:
        return {"Code": code, "Message": message, "Data": None}
    items = [
        {
            "Title": f"<em>{query}</em> answer {i}",
            "ContentType": "answer",
            "ContentID": str(i),
            "ContentText": f"Text {i} about {query} &amp; more.",
            "Url": f"https://www.zhihu.com/answer/{i}",
            "VoteUpCount": 100 - i,
            "AuthorName": "fake",
        }
        for i in range(n)
    ]
    return {"Code": 0, "Message": message, "Data": {"Items": items}}


def _retriever_hits(query: str, n: int, params: dict[str, str]) -> list[dict[str, Any]]:
    docs = [{"id": str(i), "contents": f'"{query} title {i}"\n{query} text {i}'} for i in range(n)]
    if params.get("return_scores") == "true":
        return [{"document": d, "score": float(n - i)} for i, d in enumerate(docs)]
    return docs


@contextmanager
def start_fake_search_server(
    behaviour: Behaviour | None = None, port: int = 0
) -> Iterator[tuple[str, FakeSearchServer]]:
    """Run a fake on a loopback port (``port``, or a free one) for the duration of the block:
    yields ``(base_url, server)``; use ``base_url`` as ``[search] api_base``. Started again
    on the same port, it is a restarted service."""
    server = FakeSearchServer(behaviour or Behaviour(), port)
    thread = threading.Thread(
        target=server.serve_forever, args=(0.02,), name="fake-search", daemon=True
    )
    thread.start()
    try:
        yield server.base_url, server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


#: the same server, named for what a test talks to
start_fake_zhihu = start_fake_search_server
start_fake_retriever = start_fake_search_server
