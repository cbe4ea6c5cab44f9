"""Retrieval quality, size and speed on the offline world: BM25 vs dense (flat, ivfpq, hnsw).

    python bench/retrieval.py                     # the built-in encoder (wordllama:l2_supercat)
    python bench/retrieval.py --encoder PATH      # any sentence-transformers model folder

Corpus: ``builtin:world/corpus.jsonl`` (5,000 one-paragraph documents about invented
entities). Queries: the 320 held-out questions (``builtin:world/heldout.jsonl``); a question's
gold passage is the document of the entity it asks about (its id holds the entity id: the
first hop of a two-hop question). For each retriever:

* ``recall@1`` / ``recall@3``: share of questions whose gold passage is in the top 1 / 3;
* ``bytes_per_passage``: the index file over the passage count (BM25: its saved folder);
* ``build_pps``: passages indexed per second (encode + index, from the index card);
* ``qps_single``: queries per second one at a time; ``qps_batched``: in batches of 64 (what
  the ``dense`` provider's batch window and the ``search_r1`` client send);
* compressed kinds: ``recall10_vs_flat``, the share of flat's top 10 they also return.

``hybrid_rrf`` fuses BM25's and dense flat's top 20 by reciprocal rank (k = 60); measured here
only, it is not a provider.

``server``: ``searchr1 serve-retriever`` on the flat index (a real process on loopback), then
1, 32 and 128 concurrent clients (one keep-alive connection each) sending
:data:`REQUESTS_PER_LEVEL` single-query requests in all (topk 3, a held-out question each),
each within :data:`REQUEST_TIMEOUT_S` and the level within :data:`LEVEL_DEADLINE_S`: per level ``p50_ms`` / ``p99_ms`` of a request, ``errors``
(a non-200 answer, a reset, a timeout), ``rps``, and ``queries_per_search`` (how many queries
each encode + FAISS search took, from ``/health``); once per ``--batch-window-ms`` given.
``--server-only`` skips the quality part. Ends by printing one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.core.assets import resolve
from searchr1.core.plugins import load_registry
from searchr1.plugins.dense_search.index import DenseIndex, build_index
from searchr1.plugins.local_search import Bm25Index, LocalSearchSettings

BATCH = 64
RRF_K = 60
#: concurrent clients of the server bench, and the requests each level sends in all
CLIENTS = (1, 32, 128)
REQUESTS_PER_LEVEL = 512
#: seconds one request may take before it counts as an error; one level may take
REQUEST_TIMEOUT_S = 30.0
LEVEL_DEADLINE_S = 120.0


def _heldout() -> tuple[list[str], list[str]]:
    rows = [
        json.loads(x)
        for x in Path(resolve("builtin:world/heldout.jsonl", load_registry().assets)).open()
    ]
    return [r["question"] for r in rows], [r["id"].split("-", 1)[1] for r in rows]


def _recall(ranked: list[list[str]], gold: list[str], k: int) -> float:
    return sum(g in r[:k] for r, g in zip(ranked, gold, strict=True)) / len(gold)


def _qps(fn: Any, queries: list[str], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        fn(queries[i : i + batch])
    return len(queries) / (time.perf_counter() - start)


def bench_bm25(corpus: Path, queries: list[str], work: Path) -> tuple[dict, list[list[str]]]:
    copy = work / "bm25" / "corpus.jsonl"
    copy.parent.mkdir(parents=True)
    shutil.copy(corpus, copy)
    start = time.perf_counter()
    index = Bm25Index.open(copy, LocalSearchSettings(corpus=str(copy)))
    build_s = time.perf_counter() - start
    ids = [json.loads(x)["id"] for x in copy.open()]
    by_title = {}
    for i, line in enumerate(copy.open()):
        by_title[json.loads(line)["contents"]] = ids[i]

    def ranked(q: str, k: int) -> list[str]:
        out = []
        for r in index.search(q, k):
            out.append(by_title[f'"{r.title}"\n{r.text}'])
        return out

    tops = [ranked(q, 20) for q in queries]
    folder = next(copy.parent.glob(".corpus.jsonl.bm25"))
    size = sum(p.stat().st_size for p in folder.iterdir() if p.name != "spans.npy")
    start = time.perf_counter()
    for q in queries:
        index.search(q, 3)
    qps = len(queries) / (time.perf_counter() - start)
    return {
        "bytes_per_passage": round(size / len(index), 1),
        "build_pps": round(len(index) / build_s),
        "qps_single": round(qps),
    }, tops


def bench_dense(
    corpus: Path, queries: list[str], work: Path, encoder: str, kind: str, nprobe: int
) -> tuple[dict, list[list[str]], np.ndarray]:
    card, _ = build_index(corpus, work / kind, encoder_name=encoder, kind=kind)
    index = DenseIndex(work / kind, nprobe=nprobe)
    rows = index.ids(queries, 20)
    doc_ids = [[index.document(int(i))["id"] for i in row if i >= 0] for row in rows]
    single = _qps(lambda qs: index.search(qs, 3), queries, 1)
    batched = _qps(lambda qs: index.search(qs, 3), queries, BATCH)
    result = {
        "bytes_per_passage": card.bytes_per_passage,
        "build_pps": round(card.count / card.build_seconds),
        "qps_single": round(single),
        "qps_batched": round(batched),
        **({"params": card.params} if card.params else {}),
    }
    index.close()
    return result, doc_ids, rows


async def _post(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], body: bytes
) -> tuple[int, bytes]:
    """One keep-alive ``POST /retrieve``: the status and the body of the answer."""
    reader, writer = conn
    head = b"POST /retrieve HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def _load(host: str, port: int, queries: list[str], clients: int) -> dict:
    """``clients`` concurrent clients, one connection each, sending single-query requests;
    latency and errors. A bare HTTP/1.1 client on asyncio streams: it costs the shared CPU
    next to nothing, so the numbers are the server's (httpx spends ~5 ms of CPU a request)."""
    import httpx

    per_client = max(1, REQUESTS_PER_LEVEL // clients)
    latencies: list[float] = []
    errors = 0

    async def client(c: int) -> None:
        nonlocal errors
        conn = None
        for r in range(per_client):
            query = queries[(c * per_client + r) % len(queries)]
            body = json.dumps({"queries": [query], "topk": 3}).encode()
            start = time.perf_counter()
            try:
                conn = conn or await asyncio.open_connection(host, port)
                status, answer = await asyncio.wait_for(_post(conn, body), REQUEST_TIMEOUT_S)
                ok = status == 200 and len(json.loads(answer)["result"]) == 1
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError, KeyError):
                ok, conn = False, None  # a reset, a timeout, a malformed answer: reconnect
            latencies.append(time.perf_counter() - start)
            errors += not ok
        if conn:
            conn[1].close()

    url = f"http://{host}:{port}"
    before = httpx.get(url + "/health").json()
    start = time.perf_counter()
    tasks = [asyncio.ensure_future(client(c)) for c in range(clients)]
    _, late = await asyncio.wait(tasks, timeout=LEVEL_DEADLINE_S)
    for task in late:
        task.cancel()
    wall = time.perf_counter() - start
    after = httpx.get(url + "/health").json()
    sent = clients * per_client
    errors += sent - len(latencies)  # cut off by the deadline
    ms = np.array(latencies) * 1000.0
    searches = max(1, after["searches"] - before["searches"])
    return {
        "requests": sent,
        "errors": errors,
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "rps": round(len(latencies) / wall),
        "queries_per_search": round((after["requests"] - before["requests"]) / searches, 1),
    }


def bench_server(index: Path, queries: list[str], window_ms: float) -> dict:
    """``searchr1 serve-retriever`` as a process, loaded at each of :data:`CLIENTS`."""
    command = [sys.executable, "-m", "searchr1.cli", "serve-retriever", "--index", str(index)]
    command += ["--port", "0", "--batch-window-ms", str(window_ms)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = ""
        for line in server.stdout:
            if line.startswith("listening on "):
                url = line.split()[-1].removesuffix("/retrieve")
                break
        if not url:
            raise SystemExit(f"serve-retriever did not start (exit {server.wait()})")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return {f"clients_{n}": asyncio.run(_load(host, int(port), queries, n)) for n in CLIENTS}
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=60)


def rrf(a: list[str], b: list[str]) -> list[str]:
    score: dict[str, float] = {}
    for ranked in (a, b):
        for rank, doc in enumerate(ranked):
            score[doc] = score.get(doc, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(score, key=lambda d: -score[d])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", default="", help="default: wordllama:l2_supercat")
    parser.add_argument("--nprobe", type=int, default=16, help="ivfpq lists searched")
    parser.add_argument(
        "--batch-window-ms",
        type=float,
        nargs="+",
        default=[0.0, 5.0],
        help="serve-retriever's window for the server bench (default: 0 then 5)",
    )
    parser.add_argument("--server-only", action="store_true", help="only the server bench")
    args = parser.parse_args()
    os.environ.setdefault("SEARCHR1_LOAD_PLUGINS", "")
    corpus = Path(resolve("builtin:world/corpus.jsonl", load_registry().assets))
    queries, gold = _heldout()
    out: dict[str, Any] = {"bench": "retrieval", "passages": None, "queries": len(queries)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.server_only:
            build_index(corpus, work / "flat", encoder_name=args.encoder, kind="flat")
        else:
            quality(out, corpus, queries, gold, work, args)
        for i, window in enumerate(args.batch_window_ms):
            name = f"server_window_{window:g}ms" + (f"_{i}" if i >= 2 else "")
            out[name] = bench_server(work / "flat", queries, window)
        out["passages"] = sum(1 for _ in corpus.open())
    out["encoder"] = args.encoder or "wordllama:l2_supercat"
    out["cpus"] = os.cpu_count()
    out["load"] = round(os.getloadavg()[0], 1)
    out["python"] = platform.python_version()
    for name, value in out.items():
        if isinstance(value, dict):
            print(f"{name}: " + json.dumps(value), file=sys.stderr)
    print(json.dumps(out))


def quality(
    out: dict[str, Any],
    corpus: Path,
    queries: list[str],
    gold: list[str],
    work: Path,
    args: argparse.Namespace,
) -> None:
    """Recall, size and speed of BM25 and the dense kinds (the indexes stay in ``work``)."""
    bm25, bm25_top = bench_bm25(corpus, queries, work)
    bm25.update(recall_at_1=_recall(bm25_top, gold, 1), recall_at_3=_recall(bm25_top, gold, 3))
    out["bm25"] = bm25
    flat_rows = None
    dense_top: dict[str, list[list[str]]] = {}
    for kind in ("flat", "ivfpq", "hnsw"):
        result, top, rows = bench_dense(corpus, queries, work, args.encoder, kind, args.nprobe)
        result["recall_at_1"] = _recall(top, gold, 1)
        result["recall_at_3"] = _recall(top, gold, 3)
        if kind == "flat":
            flat_rows = rows
        else:
            assert flat_rows is not None
            hits = [len(set(a[:10]) & set(b[:10])) for a, b in zip(rows, flat_rows, strict=True)]
            result["recall10_vs_flat"] = round(sum(hits) / (10 * len(hits)), 4)
        out[f"dense_{kind}"] = result
        dense_top[kind] = top
    fused = [rrf(a, b) for a, b in zip(bm25_top, dense_top["flat"], strict=True)]
    out["hybrid_rrf"] = {
        "recall_at_1": _recall(fused, gold, 1),
        "recall_at_3": _recall(fused, gold, 3),
    }


if __name__ == "__main__":
    main()
