"""``searchr1 serve-retriever``: one dense index shared over HTTP with Search-R1's protocol.

Code written for the original Search-R1 retrieval server works unchanged, and so does the
``search_r1`` provider (``docs/protocols.md`` §2)::

    POST /retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"},
                      "score": 0.83}, ...], ...]}

Without ``return_scores`` (or with it false) each result list holds the documents themselves,
as the original does. ``topk`` defaults to 3. A malformed request gets HTTP 400 with
``{"error": "..."}`` naming the field; ``GET /health`` returns the index card's summary.
Requests are served on a thread each; the queries of every request arriving within
``batch_window_ms`` (5 ms) of each other, from one trainer or several, are encoded and searched
together by one worker thread (:class:`SearchBatcher`), so the encoder sees full batches and
FAISS's threads are not shared by concurrent searches.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1.plugins.dense_search.index import DenseIndex

RETRIEVE_PATH = "/retrieve"
DEFAULT_TOPK = 3
#: queries one request may carry (a bigger batch is a client bug or an attack)
MAX_QUERIES = 4096
MAX_TOPK = 1000
MAX_BODY_BYTES = 16 * 1024 * 1024


class BadRequest(ValueError):
    """A request the server answers with 400; the message names the field."""


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body; BadRequest otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest('the body must be a JSON object with "queries"')
    queries = data.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest('"queries" must be a list of strings')
    if len(queries) > MAX_QUERIES:
        raise BadRequest(f'"queries" holds {len(queries)} queries; at most {MAX_QUERIES}')
    topk = data.get("topk", DEFAULT_TOPK)
    if topk is None:
        topk = DEFAULT_TOPK
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(f'"topk" must be a whole number from 1 to {MAX_TOPK}, got {topk!r}')
    scores = data.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(f'"return_scores" must be true or false, got {scores!r}')
    return queries, topk, scores


def answer(found: list[list[tuple[dict, float]]], return_scores: bool) -> dict:
    """The ``/retrieve`` response body for one request's hits."""
    if return_scores:
        return {"result": [[{"document": d, "score": s} for d, s in hits] for hits in found]}
    return {"result": [[d for d, _ in hits] for hits in found]}


@dataclass
class _Job:
    queries: list[str]
    topk: int
    done: threading.Event = field(default_factory=threading.Event)
    found: list[list[tuple[dict, float]]] | None = None
    error: BaseException | None = None


class SearchBatcher:
    """One worker thread that answers the queries of every request arriving within
    ``window_s`` of each other (several trainers, or a trainer's concurrent batches) with one
    encode and one index search, up to ``max_queries`` at a time."""

    def __init__(self, index: DenseIndex, window_s: float = 0.005, max_queries: int = 256):
        self.index, self.window_s, self.max_queries = index, window_s, max_queries
        self.searches = 0  # index searches run (tests and /health read it)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="retriever-batcher", daemon=True)
        self._thread.start()

    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        job = _Job(queries, topk)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.found is not None
        return job.found

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    def _work(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs, count = [first], len(first.queries)
            deadline = time.monotonic() + self.window_s
            while count < self.max_queries:
                try:
                    job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                jobs.append(job)
                count += len(job.queries)
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        try:
            found = self.index.search(
                [q for j in jobs for q in j.queries], max(j.topk for j in jobs)
            )
            self.searches += 1
            start = 0
            for job in jobs:
                hits = found[start : start + len(job.queries)]
                job.found = [h[: job.topk] for h in hits]
                start += len(job.queries)
        except Exception as exc:  # noqa: BLE001 - each request answers 500, the server lives
            for job in jobs:
                job.error = exc
        finally:
            for job in jobs:
                job.done.set()


class RetrieverServer(ThreadingHTTPServer):
    """A threading HTTP server holding one :class:`DenseIndex`; searches go through one
    :class:`SearchBatcher`."""

    daemon_threads = True

    def __init__(
        self,
        index: DenseIndex,
        host: str = "127.0.0.1",
        port: int = 8000,
        batch_window_ms: float = 5.0,
    ):
        super().__init__((host, port), _Handler)
        self.index = index
        self.batcher = SearchBatcher(index, batch_window_ms / 1000.0)
        self.requests_served = 0
        self._count_lock = threading.Lock()

    def server_close(self) -> None:
        super().server_close()
        self.batcher.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: RetrieverServer
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools connections

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?")[0] != RETRIEVE_PATH:
            return self._send(404, {"error": f"no such path {self.path}; POST {RETRIEVE_PATH}"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return self._send(413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
        try:
            queries, topk, scores = parse_request(self.rfile.read(length))
            body = answer(self.server.batcher.search(queries, topk), scores)
        except BadRequest as exc:
            return self._send(400, {"error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a server bug answers 500, the server lives
            return self._send(500, {"error": f"internal error ({type(exc).__name__})"})
        with self.server._count_lock:
            self.server.requests_served += 1
        self._send(200, body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?")[0] in ("/health", "/"):
            card = self.server.index.card
            return self._send(
                200,
                {
                    "status": "ok",
                    "index": card.summary(),
                    "kind": card.kind,
                    "count": card.count,
                    "encoder": card.encoder,
                    "requests": self.server.requests_served,
                    "searches": self.server.batcher.searches,
                },
            )
        self._send(404, {"error": f"no such path {self.path}; POST {RETRIEVE_PATH}"})

    def _send(self, status: int, body: Any) -> None:
        raw = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return None  # one line per request would drown a training node's log
