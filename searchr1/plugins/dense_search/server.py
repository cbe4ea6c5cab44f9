"""``searchr1 serve-retriever``: one dense index shared over HTTP with Search-R1's protocol.

Code written for the original Search-R1 retrieval server works unchanged, and so does the
``search_r1`` provider (``docs/protocols.md`` §2)::

    POST /retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"},
                      "score": 0.83}, ...], ...]}
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import h11
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    from searchr1.plugins.dense_search.index import DenseIndex

RETRIEVE_PATH = "/retrieve"
DEFAULT_TOPK = 3
#: bytes of one request body (1 KiB for each of :data:`MAX_QUERIES` queries)
MAX_BODY_BYTES = 4 * 1024 * 1024
#: bytes of an oversized body read before its 413 (beyond them the connection is dropped)
DRAIN_BYTES = 4 * MAX_BODY_BYTES
#: JSON nesting of one body (a request nests 2 deep: an object holding a list)
MAX_DEPTH = 32
#: queries one request may carry (a bigger batch is a client bug or an attack)
MAX_QUERIES = 4096
MAX_TOPK = 1000
#: queries x topk of one request: what it costs to read, encode and send back
MAX_HITS = 65536
#: the queries one encode + search takes (more waiting requests wait for the next one)
MAX_BATCH_QUERIES = 256
#: seconds a stop waits for requests in flight before dropping them
GRACEFUL_STOP_S = 5

log = logging.getLogger("uvicorn.error")  # the server's own log, formatted as uvicorn's lines

Hits = list[list[tuple[dict, float]]]


class BadRequest(ValueError):
    """A client error: ``status`` (400, 413, 422) and a message naming the field."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = np.zeros(256, np.int32)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def nesting_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest, read without parsing it (the
    parser recurses once per level): escapes and strings dropped, brackets counted."""
    marks = _STRING.sub(b"", _ESCAPE.sub(b"", body).translate(None, _NOT_STRUCTURE))
    if not marks:
        return 0
    return int(np.cumsum(_STEP[np.frombuffer(marks, np.uint8)]).max())


def _shown(value: Any) -> str:
    """A client's value as JSON, cut short (it may be megabytes)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _query(i: int, value: Any) -> str:
    if not isinstance(value, str):
        raise BadRequest(422, f'"queries"[{i}] must be a string, got {type(value).__name__}')
    if not value.strip():
        raise BadRequest(422, f'"queries"[{i}] is empty: every query needs some text')
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            422,
            f'"queries"[{i}] is not valid Unicode: a lone surrogate '
            f"\\u{ord(value[exc.start]):04x} at character {exc.start}",
        ) from None
    return value


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body within the limits;
    :class:`BadRequest` (400 / 413 / 422) naming the field otherwise."""
    if not body.strip():
        raise BadRequest(400, 'the body is empty: send a JSON object with "queries"')
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        raise BadRequest(400, f"the body nests {depth} levels deep; at most {MAX_DEPTH}")
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"the body is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            400, f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(data, dict):
        raise BadRequest(422, 'the body must be a JSON object with "queries"')
    if "queries" not in data:
        raise BadRequest(422, '"queries" is missing: a list of query strings')
    queries = data["queries"]
    if not isinstance(queries, list):
        raise BadRequest(422, f'"queries" must be a list of strings, got {type(queries).__name__}')
    if not queries:
        raise BadRequest(422, '"queries" is empty: send at least one query')
    if len(queries) > MAX_QUERIES:
        raise BadRequest(
            413, f'"queries" holds {len(queries)} queries; at most {MAX_QUERIES} a request'
        )
    queries = [_query(i, q) for i, q in enumerate(queries)]
    topk = data.get("topk")
    if topk is None:
        topk = DEFAULT_TOPK
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(
            422, f'"topk" must be a whole number from 1 to {MAX_TOPK}, got {_shown(topk)}'
        )
    if len(queries) * topk > MAX_HITS:
        raise BadRequest(
            413,
            f'{len(queries)} "queries" x "topk" {topk} = {len(queries) * topk} hits; at most '
            f"{MAX_HITS} a request: send fewer queries per request or a smaller topk",
        )
    scores = data.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(422, f'"return_scores" must be true or false, got {_shown(scores)}')
    return queries, topk, scores


def answer(found: Hits, return_scores: bool) -> dict:
    """The ``/retrieve`` response body for one request's hits."""
    if return_scores:
        return {"result": [[{"document": d, "score": s} for d, s in hits] for hits in found]}
    return {"result": [[d for d, _ in hits] for hits in found]}


@dataclass
class _Job:
    queries: list[str]
    topk: int
    future: asyncio.Future[Hits]


class SearchBatcher:
    """Answers the queries of concurrent requests with one encode and one index search on a
    single worker thread: every request waiting when a search starts (after ``window_s``
    from the first) goes in it, up to ``max_queries`` queries and :data:`MAX_HITS` hits (a
    bigger request alone)."""

    def __init__(
        self, index: DenseIndex, window_s: float = 0.0, max_queries: int = MAX_BATCH_QUERIES
    ):
        self.index, self.window_s, self.max_queries = index, window_s, max_queries
        self.searches = 0  # index searches run (tests and /health read it)
        self._waiting: deque[_Job] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="retriever-search")

    async def search(self, queries: list[str], topk: int) -> Hits:
        """Per query, up to ``topk`` ``(document, score)`` best first."""
        job = _Job(queries, topk, asyncio.get_running_loop().create_future())
        self._waiting.append(job)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await job.future

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _take(self) -> list[_Job]:
        """The waiting jobs, first come first, that one search takes: up to ``max_queries``
        queries and :data:`MAX_HITS` hits (every query is searched at the largest topk)."""
        jobs = [self._waiting.popleft()]
        count, topk = len(jobs[0].queries), jobs[0].topk
        while self._waiting:
            more, deeper = count + len(self._waiting[0].queries), max(topk, self._waiting[0].topk)
            if more > self.max_queries or more * deeper > MAX_HITS:
                break
            jobs.append(self._waiting.popleft())
            count, topk = more, deeper
        return jobs

    async def _drain(self) -> None:
        await asyncio.sleep(self.window_s)
        loop = asyncio.get_running_loop()
        while self._waiting:
            jobs = self._take()
            try:
                found = await loop.run_in_executor(self._worker, self._search, jobs)
            except Exception as exc:  # noqa: BLE001 - each request answers 500, the server lives
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            for job, hits in zip(jobs, found, strict=True):
                if not job.future.done():
                    job.future.set_result(hits)

    def _search(self, jobs: list[_Job]) -> list[Hits]:
        found = self.index.search([q for j in jobs for q in j.queries], max(j.topk for j in jobs))
        self.searches += 1
        out, start = [], 0
        for job in jobs:
            out.append([h[: job.topk] for h in found[start : start + len(job.queries)]])
            start += len(job.queries)
        return out


async def read_body(request: Request) -> bytes:
    """The request's body; :class:`BadRequest` 413 past :data:`MAX_BODY_BYTES`, after
    reading (and dropping) the rest up to :data:`DRAIN_BYTES`: a client sends its whole
    body before it reads the answer, and a connection closed on unread bytes is reset,
    which loses the 413 it was sent."""
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0  # h11 refused other values
    if size > DRAIN_BYTES:
        raise BadRequest(413, f"the body is {size} bytes; at most {MAX_BODY_BYTES}")
    body, received = bytearray(), 0
    async for chunk in request.stream():
        received += len(chunk)
        if received <= MAX_BODY_BYTES:
            body += chunk
        elif received > DRAIN_BYTES:
            break
    if received > MAX_BODY_BYTES:
        size = f"{received} bytes" if received <= DRAIN_BYTES else f"over {DRAIN_BYTES} bytes"
        raise BadRequest(413, f"the body is {size}; at most {MAX_BODY_BYTES}")
    return bytes(body)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    # json.dumps's defaults, as the server always answered (Starlette's JSONResponse refuses
    # NaN scores and compacts separators)
    raw = json.dumps(body, ensure_ascii=False).encode()
    return Response(raw, status, headers, media_type="application/json")


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (IPv4 or IPv6 as the host resolves);
    OSError when the address cannot be used."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on such sockets,
    # and with it on, the body written after the headers waits ~40 ms for the client's ACK
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class _Http(H11Protocol):
    """uvicorn's h11 protocol, its 400 for a request it cannot frame a JSON body too."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": f"{msg} (request line, headers or Content-Length)"})
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body.encode()),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, remembering the first signal that stopped it."""

    signum = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signum = self.signum or sig
        super().handle_exit(sig, frame)


class RetrieverServer:
    """One :class:`DenseIndex` served on ``host``:``port`` (bound here: OSError if it
    cannot be); searches go through one :class:`SearchBatcher`. :meth:`serve` runs it in
    the calling thread until :meth:`stop` or SIGINT / SIGTERM."""

    def __init__(
        self,
        index: DenseIndex,
        host: str = "127.0.0.1",
        port: int = 8000,
        batch_window_ms: float = 0.0,
    ):
        self.index = index
        self.batcher = SearchBatcher(index, batch_window_ms / 1000.0)
        self.requests_served = 0
        self.socket = listen(host, port)
        app = Starlette(
            routes=[
                Route(RETRIEVE_PATH, self._retrieve, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/", self._health, methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._http_error},
        )
        config = uvicorn.Config(
            app,
            http=_Http,
            lifespan="off",
            log_level="warning",
            access_log=False,  # one line per request would drown a training node's log
            server_header=False,
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
        )
        self._server = _Uvicorn(config)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve(self) -> int:
        """Serve until stopped; the signal number that stopped it (SIGINT, SIGTERM), or 0
        after :meth:`stop`. A second SIGINT drops the requests still in flight."""
        main = threading.current_thread() is threading.main_thread()
        caught = (signal.SIGINT, signal.SIGTERM) if main else ()
        # uvicorn handles both while it runs and raises them again when it is done: this
        # handler takes them before it starts and after it ends too
        previous = {sig: signal.signal(sig, self._server.handle_exit) for sig in caught}
        try:
            asyncio.run(self._server.serve(sockets=[self.socket]))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._server.signum

    def stop(self) -> None:
        """Ask :meth:`serve` (in another thread) to finish."""
        self._server.should_exit = True

    def close(self) -> None:
        self.socket.close()
        self.batcher.close()

    async def _retrieve(self, request: Request) -> Response:
        try:
            body = await read_body(request)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to read it
        except BadRequest as exc:
            return _json(exc.status, {"error": str(exc)}, {"Connection": "close"})
        try:
            queries, topk, scores = parse_request(body)
            found = await self.batcher.search(queries, topk)
        except BadRequest as exc:
            return _json(exc.status, {"error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a server fault answers 500, the server lives
            log.error("%s failed: %s: %s", RETRIEVE_PATH, type(exc).__name__, exc)
            return _json(500, {"error": f"internal error ({type(exc).__name__}): {exc}"})
        self.requests_served += 1
        return _json(200, answer(found, scores))

    async def _health(self, request: Request) -> Response:
        card = self.index.card
        return _json(
            200,
            {
                "status": "ok",
                "index": card.summary(),
                "kind": card.kind,
                "count": card.count,
                "encoder": card.encoder,
                "requests": self.requests_served,
                "searches": self.batcher.searches,
            },
        )

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.method} {request.url.path}: use {allowed}"
        elif exc.status_code == 404:
            message = f"no such path {request.url.path}; POST {RETRIEVE_PATH} or GET /health"
        else:
            message = exc.detail
        return _json(exc.status_code, {"error": message}, exc.headers)
