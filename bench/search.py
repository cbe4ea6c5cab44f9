"""Search throughput under a concurrency limit, and local BM25 query latency.

    python bench/search.py                 # 200 searches, 50 ms latency, limit 16; 10k docs
    python bench/search.py --searches 400 --latency 0.1 --concurrency 32 --docs 20000

Part 1: the ``zhihu`` provider (the shared HTTP reliability layer: key rotation, semaphore,
pooled httpx connections) sends ``--searches`` distinct queries at once to the loopback fake
service of ``tests/helpers/search_fakes.py`` (in a child process), which sleeps ``--latency`` seconds per request. With a
limit of C concurrent requests the ideal wall time is ``ceil(N / C) * latency``; a serial
client would take ``N * latency``. The cache is off so every query reaches the server.

Part 2: the ``local`` provider over a generated corpus of ``--docs`` documents (random words
from a 20,000-word vocabulary, 40-120 words each): index build time once, then the median and
p95 latency of ``search`` over 300 distinct queries (cache off), i.e. what a trajectory waits.

Ends by printing one JSON line: wall_s, ideal_s, serial_s, bm25_query_ms, ...
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing as mp
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))  # the loopback fake lives with the tests

from search_fakes import Behaviour, start_fake_zhihu  # noqa: E402

from searchr1.core.config import parse_config  # noqa: E402
from searchr1.core.plugins import load_registry  # noqa: E402
from searchr1.plugins.local_search import LocalBM25Search  # noqa: E402
from searchr1.plugins.zhihu_search import ZhihuSearch  # noqa: E402


def _serve(latency: float, urls: mp.Queue, stop: Any) -> None:
    """Child process: the fake service, so its CPU time does not share the client's GIL."""
    with start_fake_zhihu(Behaviour(latency_s=latency)) as (base_url, server):
        urls.put(base_url)
        stop.wait()
        urls.put(server.max_in_flight)


def bench_http(searches: int, latency: float, concurrency: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_serve, args=(latency, urls, stop), daemon=True)
    child.start()
    try:
        base_url = urls.get(timeout=60)
        text = (
            f'[search]\nprovider = "zhihu"\napi_keys = "bench-key-1,bench-key-2"\n'
            f'api_base = "{base_url}"\nmax_concurrency = {concurrency}\ncache = false\n'
        )
        provider = ZhihuSearch(parse_config(text, source="bench", env={}, registry=load_registry()))

        async def run() -> float:
            await provider.search("warm-up", 3)  # imports and the first connection
            start = time.perf_counter()
            responses = await asyncio.gather(
                *(provider.search(f"query number {i}", 3) for i in range(searches))
            )
            wall = time.perf_counter() - start
            await provider.aclose()
            failed = [r.error for r in responses if not r.ok]
            if failed:
                raise SystemExit(f"{len(failed)} searches failed, e.g. {failed[0]}")
            return wall

        wall = asyncio.run(run())
        stop.set()
        max_in_flight = urls.get(timeout=60)
    finally:
        stop.set()
        child.join(timeout=10)
    ideal = math.ceil(searches / concurrency) * latency
    return {
        "searches": searches,
        "latency_s": latency,
        "max_concurrency": concurrency,
        "wall_s": round(wall, 4),
        "ideal_s": round(ideal, 4),
        "serial_s": round(searches * latency, 4),
        "wall_over_ideal": round(wall / ideal, 3) if ideal else None,
        "server_max_in_flight": max_in_flight,
    }


def write_corpus(path: Path, docs: int, rng: random.Random) -> list[str]:
    vocab = [f"w{i:05d}" for i in range(20_000)]
    # Zipf-like word frequencies, as in real text (cumulative once: choices() is then cheap)
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(vocab))))
    with path.open("w", encoding="utf-8") as fh:
        for i in range(docs):
            words = rng.choices(vocab, cum_weights=cum_weights, k=rng.randint(40, 120))
            contents = f'"Entity {i}"\n' + " ".join(words)
            fh.write(json.dumps({"id": str(i), "contents": contents}) + "\n")
    return vocab


def bench_bm25(docs: int, queries: int = 300) -> dict[str, float]:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus.jsonl"
        vocab = write_corpus(corpus, docs, rng)
        text = f'[search]\ncache = false\n[search.local]\ncorpus = "{corpus}"\n'
        config = parse_config(text, source="bench", env={}, registry=load_registry())
        start = time.perf_counter()
        provider = LocalBM25Search.from_config(config)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        LocalBM25Search.from_config(config)
        load_s = time.perf_counter() - start

        async def run() -> list[float]:
            times = []
            for _ in range(queries):
                query = " ".join(rng.choices(vocab[:5000], k=rng.randint(3, 8)))
                t0 = time.perf_counter()
                response = await provider.search(query, 3)
                times.append(time.perf_counter() - t0)
                assert response.ok
            return times

        times = asyncio.run(run())
        times_ms = sorted(t * 1000 for t in times)
        return {
            "bm25_docs": docs,
            "bm25_build_s": round(build_s, 3),
            "bm25_load_cached_s": round(load_s, 3),
            "bm25_query_ms": round(statistics.median(times_ms), 3),
            "bm25_query_p95_ms": round(times_ms[math.ceil(0.95 * len(times_ms)) - 1], 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--docs", type=int, default=10_000)
    args = parser.parse_args()
    result = {
        **bench_http(args.searches, args.latency, args.concurrency),
        **bench_bm25(args.docs),
        "python": platform.python_version(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
