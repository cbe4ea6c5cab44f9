"""GPU check of the ``local`` provider at the seed's shapes, with random weights.

    python bench/gpu.py           # on one GPU (H200: meant to finish in < 8 minutes)
    python bench/gpu.py --tiny    # the same code path on the CPU with tiny shapes (CI)

Needs only torch, transformers and peft, and no network: the models are built from the
configs kept in ``bench/configs/`` (``qwen3-4b.json``, ``qwen3.5-4b.json``: the shapes of
Qwen3-4B and Qwen3.5-4B, no weights) with random weights, bf16 on CUDA. The tokenizer is the
project's built-in one (its ids are a subset of either model's vocabulary).

Per model: a seed-shaped rollout (8 questions x group 8, ``--turns`` sampled turns per
trajectory with a synthetic observation between them, issued concurrently as the rollout
does, cache reuse on), then one training step (``forward_backward`` over every trajectory as
one datum, importance-sampling loss, ``optim_step``; gradient checkpointing on with CUDA).
Prints ONE JSON line: per model tokens/s, peak memory, prefill_ratio, ``logprob_diff_max``
and the min/mean/max of the sampler-to-learner ratio exp(learner - sampler) over trained
tokens, and the training step's time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CONFIGS = Path(__file__).resolve().parent / "configs"
MODELS = ("qwen3-4b", "qwen3.5-4b")
# --tiny: the same families, shrunk so both run on a CPU in seconds.
TINY = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
OBSERVATION = (
    "\n<information> Doc 1 (The old town) A writer lived in the old town for many years and "
    "wrote a book about its bridge. Doc 2 (Bridges) The bridge was built of stone. "
    "</information>\n"
)


def model_config(name: str, tiny: bool) -> Any:
    from transformers import AutoConfig

    data = json.loads((CONFIGS / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    model_type = data.pop("model_type")
    data.pop("architectures", None)
    if tiny:
        data.update({k: v for k, v in TINY.items() if k in data})
        if "layer_types" in data:
            data["layer_types"] = data["layer_types"][: TINY["num_hidden_layers"]]
    return AutoConfig.for_model(model_type, **data)


def build_provider(name: str, args: Any, device: Any, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.core.config import Config
    from searchr1.plugins.local_model.budget import token_budget
    from searchr1.plugins.local_model.provider import (
        LocalModelProvider,
        LocalSettings,
        _checkpointing,
        _enable_checkpointing,
        attach_lora,
    )
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tokenizer = build_tokenizer(BUILTIN_TEXT, vocab_size=600)
    config = model_config(name, args.tiny)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    base.to(device)
    run_config = Config().replace(
        model={"base_model": name, "temperature": 1.0},
        lora={"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": ("all-linear",)},
    )
    model = attach_lora(base, run_config)
    if _checkpointing("auto", device):
        _enable_checkpointing(model.get_base_model())
    budget = token_budget(0, config, dtype, device)
    return LocalModelProvider(
        model,
        tokenizer,
        device=device,
        temperature=1.0,
        settings=LocalSettings(batch_wait_ms=2.0),
        max_batch_tokens=budget,
    )


def rollout(
    provider: Any, args: Any
) -> tuple[list[tuple[list[int], list[bool], list[float]]], dict]:
    """8 x 8 multi-turn trajectories; returns (tokens, trained mask, sampler log-probs) each."""
    from searchr1.core.types import SamplingParams

    tok = provider.tokenizer
    obs = tok.encode(OBSERVATION)
    prompts = [
        tok.encode(
            f"<|im_start|>user\nQuestion {q}: who wrote the book about the old town "
            f"number {q}?<|im_end|>\n<|im_start|>assistant\n"
        )
        for q in range(args.questions)
    ]

    async def trajectory(prompt: list[int], first: Any, seed: int) -> tuple:
        tokens, mask, logprobs = list(prompt), [False] * len(prompt), [0.0] * len(prompt)
        sample = first
        for turn in range(args.turns):
            tokens += sample.tokens
            mask += [True] * len(sample.tokens)
            logprobs += sample.logprobs
            if turn == args.turns - 1:
                break
            tokens += obs
            mask += [False] * len(obs)
            logprobs += [0.0] * len(obs)
            params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0, seed=seed + turn)
            (sample,) = await provider.sample(tokens, 1, params)
        return tokens, mask, logprobs

    async def question(q: int, prompt: list[int]) -> list:
        params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0, seed=q)
        first = await provider.sample(prompt, args.group_size, params)
        return await asyncio.gather(
            *[trajectory(prompt, s, 1000 * q + 10 * k) for k, s in enumerate(first)]
        )

    async def everything() -> list:
        groups = await asyncio.gather(*[question(q, p) for q, p in enumerate(prompts)])
        return [t for g in groups for t in g]

    async def warm_up() -> None:  # first-call costs (kernels, lazy imports) stay untimed
        short = SamplingParams(max_tokens=2, temperature=1.0)
        await asyncio.gather(provider.sample(prompts[0], 2, short), provider.sample(obs, 1, short))

    asyncio.run(warm_up())
    provider.sampler.forget()
    stats = provider.sampler.stats
    before = stats.prefill_tokens
    t0 = time.perf_counter()
    trajectories = asyncio.run(everything())
    seconds = time.perf_counter() - t0
    sampled = sum(sum(m) for _, m, _ in trajectories)
    minimum = sum(len(p) for p in prompts) + len(trajectories) * (args.turns - 1) * (len(obs) + 1)
    return trajectories, {
        "rollout_s": round(seconds, 2),
        "tokens_per_s": round(sampled / seconds, 1),
        "sampled_tokens": sampled,
        "prefill_tokens": stats.prefill_tokens - before,
        "prefill_ratio": round((stats.prefill_tokens - before) / minimum, 3),
        "peak_cache_tokens": stats.peak_cache_tokens,
    }


def train_step(provider: Any, trajectories: list) -> dict:
    """One step over every trajectory; ratio stats from the loss's inputs."""
    import torch

    from searchr1.core.types import AdamParams, Datum
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    seen: dict[str, float] = {"min": float("inf"), "max": 0.0, "sum": 0.0, "n": 0}

    def watched(logprobs_T: torch.Tensor, inputs: Any) -> Any:
        with torch.no_grad():
            trained = inputs.advantages_T != 0
            ratio = (logprobs_T.detach() - inputs.sampler_logprobs_T)[trained].exp()
            if ratio.numel():
                seen["min"] = min(seen["min"], float(ratio.min()))
                seen["max"] = max(seen["max"], float(ratio.max()))
                seen["sum"] += float(ratio.sum())
                seen["n"] += ratio.numel()
        return importance_sampling(logprobs_T, inputs)

    datums = []
    for i, (tokens, mask, logprobs) in enumerate(trajectories):
        adv = 1.0 if i % 2 else -1.0
        datums.append(
            Datum(
                input_tokens=tuple(tokens[:-1]),
                target_tokens=tuple(tokens[1:]),
                sampler_logprobs=tuple(logprobs[1:]),
                advantages=tuple(adv if m else 0.0 for m in mask[1:]),
                trajectory_id=f"gpu-{i}",
            )
        )
    t0 = time.perf_counter()
    result = provider.forward_backward(datums, NamedLoss("importance_sampling", watched))
    provider.optim_step(AdamParams(learning_rate=1e-6))
    if provider.device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "step_s": round(time.perf_counter() - t0, 2),
        "train_tokens": sum(len(d) for d in datums),
        "logprob_diff_max": result.metrics["logprob_diff_max"],
        "ratio_min": seen["min"],
        "ratio_mean": seen["sum"] / max(1, seen["n"]),
        "ratio_max": seen["max"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=512)
    args = parser.parse_args()
    if args.tiny:
        args.questions, args.group_size, args.turn_tokens = 2, 2, 8

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    report: dict[str, Any] = {"bench": "gpu", "tiny": args.tiny, "device": str(device)}
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(0)
    t_all = time.perf_counter()
    for name in args.models.split(","):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        provider = build_provider(name, args, device, dtype)
        trajectories, figures = rollout(provider, args)
        figures.update(train_step(provider, trajectories))
        if cuda:
            figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        provider.close()
        del provider
        report[name] = figures
        print(f"{name}: {figures}", file=sys.stderr)
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
