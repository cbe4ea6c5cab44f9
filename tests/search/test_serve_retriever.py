"""``searchr1 serve-retriever`` under a team's load, as a real process on loopback: every
malformed or oversized request gets its 4xx with a JSON error and leaves no traceback in the
server's log, 405 for a wrong method, ``/health``, 128 concurrent clients without an error,
flags refused with exit 2, and Ctrl-C stops it with exit 130."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from searchr1.plugins.dense_search.index import build_index

ROWS = [
    {"id": "p1", "contents": '"Paris"\nParis is the capital of France, on the Seine.'},
    {"id": "p2", "contents": '"Violin"\nThe violin is a string instrument played with a bow.'},
    {"id": "p3", "contents": '"Volcano"\nA volcano erupts lava, ash and gas from the crust.'},
    {"id": "p4", "contents": '"Penguin"\nPenguins are flightless birds of the Antarctic.'},
]
QUERIES = {
    "which instrument is played with a bow": "p2",
    "flightless birds antarctic": "p4",
    "lava and ash": "p3",
}


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen
    log: Path

    def raw(self, request: bytes, *, answer: bool = True) -> tuple[int, dict]:
        """Send bytes as they are; the status and JSON body of the answer (or nothing when
        ``answer`` is false: the client hangs up)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(request)
            if not answer:
                return 0, {}
            data = b""
            while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30  # no length: read until the server closes


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("serve")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS), "utf-8")
    build_index(corpus, tmp / "index")
    return tmp / "index"


@pytest.fixture(scope="module")
def served(index: Path) -> Iterator[Served]:
    """The server as a user starts it; stopped with Ctrl-C (SIGINT) at the end: exit 130."""
    log = index.parent / "server.log"
    with log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "searchr1.cli", "serve-retriever", "--index", str(index)]
            + ["--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        lines = []
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("listening on "):
                break
        assert lines and lines[-1].startswith("listening on http://127.0.0.1:"), lines
        url = lines[-1].split()[-1].removesuffix("/retrieve")
        yield Served(url, int(url.rsplit(":", 1)[1]), process, log)
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 130, out
    assert "stopped by SIGINT after" in out


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /retrieve HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


#: (what, body, status, words of the error)
MALFORMED = [
    ("empty body", b"", 400, "empty"),
    ("not JSON", b"{oops", 400, "not JSON"),
    ("not UTF-8", b'{"queries": ["\xff\xfe"]}', 400, "not UTF-8"),
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, 400, "at most 32"),
    ("a list", b'["q"]', 422, "JSON object"),
    ("no queries", b'{"topk": 3}', 422, '"queries" is missing'),
    ("queries a string", b'{"queries": "q"}', 422, '"queries" must be a list'),
    ("queries empty", b'{"queries": []}', 422, '"queries" is empty'),
    ("a query not a string", b'{"queries": ["a", 7]}', 422, '"queries"[1] must be a string'),
    ("an empty query", b'{"queries": ["a", " "]}', 422, '"queries"[1] is empty'),
    ("a lone surrogate", b'{"queries": ["a\\ud800"]}', 422, "lone surrogate \\ud800"),
    ("topk 0", b'{"queries": ["a"], "topk": 0}', 422, '"topk"'),
    ("topk a string", b'{"queries": ["a"], "topk": "3"}', 422, '"topk"'),
    ("topk true", b'{"queries": ["a"], "topk": true}', 422, "got true"),
    ("return_scores 1", b'{"queries": ["a"], "return_scores": 1}', 422, '"return_scores"'),
    ("too many queries", json.dumps({"queries": ["q"] * 4097}).encode(), 413, "at most 4096"),
    (
        "4096 queries x topk 1000",
        json.dumps({"queries": ["q"] * 4096, "topk": 1000}).encode(),
        413,
        "at most 65536",
    ),
    ("over 4 MiB", b'{"queries": ["' + b"a" * (4 << 20) + b'"]}', 413, "at most 4194304"),
]


def test_every_malformed_request_gets_its_4xx_and_no_traceback(served: Served) -> None:
    for what, body, status, words in MALFORMED:
        code, answer = served.raw(_post(body))
        assert (code, words in answer.get("error", "")) == (status, True), (what, answer)
    # framing the HTTP parser refuses, a declared body over the limit, chunked over the limit
    head = b"POST /retrieve HTTP/1.1\r\nHost: t\r\n"
    code, answer = served.raw(head + b"Content-Length: abc\r\n\r\n{}")
    assert code == 400 and "Content-Length" in answer["error"]
    code, answer = served.raw(head + b"Content-Length: 999999999\r\n\r\n{}")
    assert code == 413 and "at most 4194304" in answer["error"]
    chunk = b"a" * (1 << 20)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5)) + b"0\r\n\r\n"
    code, answer = served.raw(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    assert code == 413 and "the body is 5242880 bytes; at most 4194304" in answer["error"]
    # wrong method and path
    wrong = httpx.get(served.url + "/retrieve")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert "use POST" in wrong.json()["error"]
    assert httpx.post(served.url + "/search", json={}).status_code == 404
    # clients that hang up: mid-body, and before their answer
    served.raw(head + b'Content-Length: 100\r\n\r\n{"que', answer=False)
    served.raw(_post(json.dumps({"queries": ["lava"], "topk": 3}).encode()), answer=False)

    ok = httpx.post(served.url + "/retrieve", json={"queries": ["lava and ash"], "topk": 1})
    assert ok.status_code == 200 and ok.json()["result"][0][0]["id"] == "p3"  # still serving
    log = served.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_health_names_the_index(served: Served) -> None:
    health = httpx.get(served.url + "/health").json()
    assert health["status"] == "ok" and health["count"] == len(ROWS)
    assert health["kind"] == "flat" and health["index"].startswith("flat index of 4 passages")


def test_128_concurrent_clients_get_every_answer(served: Served) -> None:
    before = httpx.get(served.url + "/health").json()

    async def client(pool: httpx.AsyncClient, i: int) -> list[str]:
        query = list(QUERIES)[i % len(QUERIES)]
        got = []
        for _ in range(2):
            body = {"queries": [query], "topk": 2, "return_scores": True}
            response = await pool.post(served.url + "/retrieve", json=body)
            assert response.status_code == 200, response.text
            got.append(response.json()["result"][0][0]["document"]["id"])
        return got

    async def run() -> list[list[str]]:
        # one connection per client, all opened at once
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(limits=limits, timeout=120) as pool:
            return await asyncio.gather(*(client(pool, i) for i in range(128)))

    answers = asyncio.run(run())
    expected = list(QUERIES.values())
    assert answers == [[expected[i % len(QUERIES)]] * 2 for i in range(128)]
    after = httpx.get(served.url + "/health").json()
    assert after["requests"] - before["requests"] == 256
    assert after["searches"] - before["searches"] < 256  # concurrent queries shared searches


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--batch-window-ms", "inf"),
        ("--batch-window-ms", "nan"),
        ("--batch-window-ms", "-5"),
        ("--batch-window-ms", "1e9"),
        ("--port", "70000"),
        ("--ef-search", "0"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flag: str, value: str, run_cli) -> None:  # noqa: ANN001
    result = run_cli("serve-retriever", "--index", "unused", flag, value)
    assert result.code == 2 and f"argument {flag}: must be" in result.err, result.err


def test_a_busy_port_is_refused_naming_it(index: Path, run_cli) -> None:  # noqa: ANN001
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        result = run_cli("serve-retriever", "--index", index, "--port", port)
    assert result.code == 2 and f"--port {port}: cannot listen" in result.err, result.err
    assert "Traceback" not in result.err
