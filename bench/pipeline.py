"""Seconds per training step with ``[train] max_staleness = 0`` and ``1``, in one run.

    python bench/pipeline.py          # 8 steps each; 200 ms/search, 300 ms/sample, 1 s/train call
    python bench/pipeline.py --questions 8 --sample-latency 0 --train-latency 0   # CPU-bound

The offline world (``searchr1/defaults/offline.toml``: its tiny model, questions and corpus),
with the two latencies the reference setup's setting has and the offline demo has not:

* **search**: a loopback HTTP server (a child process) that speaks the Search-R1 retriever
  protocol (``POST /retrieve``) over the world's own corpus with the same BM25 as the
  ``local`` provider, and sleeps ``--search-latency`` seconds per request; the run uses the
  ``search_r1`` provider with ``max_batch = 1`` (one request per search call) and its cache
  off, so every call pays the latency, like a Zhihu call.
* **model service**: the ``local`` provider behind :class:`ServiceLatency`, a model provider
  (registered here as ``local_service``) that waits ``--sample-latency`` seconds before each
  ``sample`` (asynchronously: concurrent samples wait together, like requests in flight to a
  service) and ``--train-latency`` seconds before each ``forward_backward`` and
  ``optim_step`` (awaited, like a call in flight to a service). The computation itself still runs
  on this machine's CPU, where sampling and training take turns on one model lock; on a real
  service it would run remotely, so this under-states what pipelining saves there.

Each mode trains ``--steps`` steps from the same seed with ``--questions`` questions x
``--group`` trajectories a step (default 4 x 8, half the demo's batch, so that the local CPU
work does not hide the latencies on a 2-core machine), held-out eval off, one checkpoint at
the end; s/step is the mean of the steps' ``time/step`` (the loop's wall time per step)
after the first. Ends with one JSON line: ``s_per_step`` for both, ``ratio`` (sync / pipelined),
the ``pipeline/*`` idle fractions, ``staleness/mean``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing as mp
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import load_registry
from searchr1.core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    Model,
    SampledSequence,
    SamplingParams,
    TrainerCapabilities,
)

CORPUS = "builtin:world/corpus.jsonl"


# --------------------------------------------------------------------------- search server


def _serve(latency: float, urls: Any, stop: Any) -> None:
    """Child process: ``POST /retrieve`` over the world's corpus, ``latency`` s per request."""
    import threading

    from searchr1.core.assets import resolve
    from searchr1.plugins.local_search import Bm25Index, LocalSearchSettings

    index = Bm25Index.open(
        Path(resolve(CORPUS, load_registry().assets)), LocalSearchSettings(corpus=CORPUS)
    )
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency)
            result = []
            for query in body["queries"]:
                with lock:
                    hits = index.search(query, int(body.get("topk", 3)))
                result.append(
                    [
                        {"document": {"contents": f'"{h.title}"\n{h.text}'}, "score": h.score}
                        for h in hits
                    ]
                )
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    urls.put(f"http://127.0.0.1:{server.server_address[1]}")
    stop.wait()
    server.shutdown()


# --------------------------------------------------------------------------- model latency


class ServiceLatency:
    """The ``local`` provider with a model service's round trips in front of its calls."""

    def __init__(self, inner: Any, sample_s: float, train_s: float) -> None:
        self.inner, self.sample_s, self.train_s = inner, sample_s, train_s

    @property
    def capabilities(self) -> TrainerCapabilities:
        """The local provider's, with this wrapper's snapshot sampler."""
        return dataclasses.replace(self.inner.capabilities, snapshot_sampler=self.snapshot_sampler)

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        await asyncio.sleep(self.sample_s)
        return await self.inner.sample(prompt_tokens, num_samples, params)

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Awaitable[ForwardBackwardResult]:
        await asyncio.sleep(self.train_s)
        return await self.inner.forward_backward(datums, loss_fn, loss_scale)

    async def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        await asyncio.sleep(self.train_s)
        return await self.inner.optim_step(adam)

    async def snapshot_sampler(self) -> None:
        await self.inner.snapshot_sampler()

    def save_state(self, path: str) -> None:
        self.inner.save_state(path)

    async def load_state(self, path: str) -> None:
        await self.inner.load_state(path)

    def close(self) -> None:
        self.inner.close()


class BenchPlugin:
    def __init__(self, sample_s: float, train_s: float) -> None:
        self.sample_s, self.train_s = sample_s, train_s

    @hookimpl
    def register_model_providers(self, register: Callable[..., None]) -> None:
        register("local_service", self.create)

    def create(self, config: Any) -> Model:
        from searchr1.plugins.local_model.provider import LocalModelProvider

        wrapped = ServiceLatency(
            LocalModelProvider.from_config(config), self.sample_s, self.train_s
        )
        return Model(sampler=wrapped, trainer=wrapped)


# --------------------------------------------------------------------------- runs


def _config_text(args: argparse.Namespace, api_base: str, staleness: int) -> str:
    from importlib.resources import files

    text = files("searchr1.defaults").joinpath("offline.toml").read_text()
    text = text.replace('provider = "local"\nbase_model', 'provider = "local_service"\nbase_model')
    text = text.replace(
        '[search]\nprovider = "local"\ntop_k = 2\n',
        f'[search]\nprovider = "search_r1"\napi_base = "{api_base}"\ncache = false\n'
        f"top_k = 2\ntimeout_seconds = 30\n\n[search.search_r1]\nmax_batch = 1\n",
    )
    steps = args.steps
    text = text.replace("max_steps = 60", f"max_steps = {steps}")
    text = text.replace("save_every = 30", f"save_every = {steps}\nmax_staleness = {staleness}")
    text = text.replace("eval_before_after = true", "eval_before_after = false")
    text = text.replace("questions_per_batch = 8", f"questions_per_batch = {args.questions}")
    text = text.replace("group_size = 8", f"group_size = {args.group}")
    return text + f"\n[model.local]\nthreads = {args.threads}\n"


def run_mode(
    plugin: BenchPlugin, args: argparse.Namespace, api_base: str, staleness: int, tmp: Path
) -> dict[str, Any]:
    from searchr1.core import runs
    from searchr1.core.config import parse_config
    from searchr1.core.train import train

    registry = load_registry([plugin])  # the bench's fake training service
    config = parse_config(
        _config_text(args, api_base, staleness), source="bench", env={}, registry=registry
    )
    run = runs.open_run(
        config, "train", registry=registry, run_dir=str(tmp / f"staleness{staleness}")
    )
    t0 = time.perf_counter()
    train(run)
    wall = time.perf_counter() - t0
    from searchr1.core.logs import read_jsonl

    events = read_jsonl(run.folder / "events.jsonl")[0]
    metrics = [e for e in events if e.get("event") == "metrics"]
    later = metrics[1:] or metrics

    def mean(key: str) -> float:
        return statistics.fmean(float(m.get(key, 0.0)) for m in later)

    return {
        "s_per_step": mean("time/step"),
        "wall_s": wall,
        "time_rollout": mean("time/rollout"),
        "time_train": mean("time/train"),
        "trainer_idle_frac": mean("pipeline/trainer_idle_frac"),
        "sampler_idle_frac": mean("pipeline/sampler_idle_frac"),
        "overlap_s": mean("pipeline/overlap_s"),
        "staleness_mean": mean("staleness/mean"),
        "reward_mean": mean("reward/mean"),
        "search_calls": mean("search/calls"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--search-latency", type=float, default=0.2)
    ap.add_argument("--sample-latency", type=float, default=0.3)
    ap.add_argument("--train-latency", type=float, default=1.0)
    ap.add_argument("--questions", type=int, default=4, help="rollout.questions_per_batch")
    ap.add_argument("--group", type=int, default=8, help="rollout.group_size")
    ap.add_argument(
        "--threads", type=int, default=0, help="[model.local] threads (0 = every core, as the demo)"
    )
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_serve, args=(args.search_latency, urls, stop), daemon=True)
    child.start()
    plugin = BenchPlugin(args.sample_latency, args.train_latency)
    try:
        api_base = urls.get(timeout=120)
        with tempfile.TemporaryDirectory() as tmp:
            results = {k: run_mode(plugin, args, api_base, k, Path(tmp)) for k in (0, 1)}
    finally:
        stop.set()
        child.join(timeout=10)
    sync, piped = results[0], results[1]
    out = {
        "steps": args.steps,
        "search_latency_s": args.search_latency,
        "sample_latency_s": args.sample_latency,
        "train_latency_s": args.train_latency,
        "questions_per_batch": args.questions,
        "group_size": args.group,
        "sync": sync,
        "pipelined": piped,
        "ratio": sync["s_per_step"] / piped["s_per_step"],
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(json.dumps(out), file=sys.stdout)


if __name__ == "__main__":
    main()
