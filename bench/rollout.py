"""Rollout throughput of the ``local`` model provider against a per-sequence ``generate`` loop.

    python bench/rollout.py            # 64 sequences x 128 new tokens, baseline on all 64
    python bench/rollout.py --quick    # same provider run, baseline timed on 8 sequences
    python bench/rollout.py --quick --vllm .venv-vllm/bin/python   # + the vllm provider

The provider run is what the rollout does: 8 questions x group 8, issued as concurrent
``sample(prompt, num_samples=8)`` calls from asyncio tasks (batched into one KV-cached
generation, each prompt prefilled once). The baseline is a plain loop of
``model.generate`` per sequence on the same model object with every sampling parameter
explicit (``do_sample=True, top_k=0, top_p=1.0``, same temperature). Both count the tokens
actually generated (a sequence may stop early at eos). A tokens/s rate is per sequence for
the loop, so timing it on a subset (``--quick``) estimates the same rate.

Then ``forward_backward`` throughput: the 64 sampled sequences as datums (importance
sampling loss), in micro-batches of 32 as the train loop sends them.

Ends by printing one JSON line: searchr1_tokens_per_s, baseline_tokens_per_s, ratio,
forward_backward_tokens_per_s, ...
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

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="baseline on 8 sequences only")
    parser.add_argument("--model", default="builtin:tiny-random", help="base_model to load")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--baseline-seqs", type=int, default=0, help="0: 8 if --quick else all")
    parser.add_argument("--vllm", default="", help="also time vLLM, launched from this Python")
    args = parser.parse_args()

    import torch

    from searchr1.core.config import Config
    from searchr1.core.types import Datum, SamplingParams
    from searchr1.plugins.local_model.provider import LocalModelProvider
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    config = Config().replace(
        model={"base_model": args.model, "temperature": args.temperature},
        lora={"dropout": 0.0},
    )
    provider = LocalModelProvider.from_config(config)
    tok = provider.tokenizer
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [
                    {
                        "role": "system",
                        "content": "Answer the question. Search with "
                        "<search> query </search>, answer with <answer> answer </answer>.",
                    },
                    {
                        "role": "user",
                        "content": f"Question {q}: who wrote the book about "
                        f"the old mountain town number {q}?",
                    },
                ],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for q in range(args.questions)
    ]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=args.temperature, top_p=1.0)
    n_seqs = args.questions * args.group_size

    async def rollout() -> list:
        return await asyncio.gather(*[provider.sample(p, args.group_size, params) for p in prompts])

    # Warm-up (first-call allocations, lazy imports) for both paths.
    asyncio.run(provider.sample(prompts[0], 2, SamplingParams(max_tokens=4)))
    model = provider.model
    ids0 = torch.tensor([prompts[0]], device=provider.device)
    gen_kwargs = dict(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=args.temperature,
        max_new_tokens=args.new_tokens,
        pad_token_id=tok.pad_token_id,
    )
    with torch.inference_mode():
        model.eval()
        model.generate(
            ids0, attention_mask=torch.ones_like(ids0), **{**gen_kwargs, "max_new_tokens": 4}
        )

    batches_before = provider.sampler.stats.batches
    t0 = time.perf_counter()
    results = asyncio.run(rollout())
    ours_s = time.perf_counter() - t0
    ours_tokens = sum(len(s.tokens) for group in results for s in group)
    ours_tps = ours_tokens / ours_s
    print(
        f"searchr1 provider: {n_seqs} seqs, {ours_tokens} tokens in {ours_s:.2f}s = "
        f"{ours_tps:.0f} tokens/s ({provider.sampler.stats.batches - batches_before} batch)"
    )

    n_base = args.baseline_seqs or (8 if args.quick else n_seqs)
    base_tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(n_base):
            ids = torch.tensor(
                [prompts[i // args.group_size % len(prompts)]], device=provider.device
            )
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)
            base_tokens += out.shape[1] - ids.shape[1]
    base_s = time.perf_counter() - t0
    base_tps = base_tokens / base_s
    print(
        f"per-sequence generate loop: {n_base} seqs, {base_tokens} tokens in {base_s:.2f}s = "
        f"{base_tps:.0f} tokens/s"
    )
    print(f"ratio: {ours_tps / base_tps:.1f}x")

    datums = []
    for p, group in zip(prompts, results, strict=True):
        for k, s in enumerate(group):
            full = p + list(s.tokens)
            n_prompt = len(p) - 1
            datums.append(
                Datum(
                    input_tokens=tuple(full[:-1]),
                    target_tokens=tuple(full[1:]),
                    sampler_logprobs=(0.0,) * n_prompt + s.logprobs,
                    advantages=(0.0,) * n_prompt + (1.0 if k % 2 else -1.0,) * len(s.tokens),
                    trajectory_id=f"bench-{len(datums)}",
                )
            )
    loss = NamedLoss("importance_sampling", importance_sampling)
    t0 = time.perf_counter()
    diff_max = 0.0
    for start in range(0, len(datums), 32):
        chunk = datums[start : start + 32]
        r = provider.forward_backward(chunk, loss, loss_scale=len(chunk) / len(datums))
        diff_max = max(diff_max, r.metrics["logprob_diff_max"])
    fb_s = time.perf_counter() - t0
    fb_positions = sum(len(d) for d in datums)
    fb_tps = fb_positions / fb_s
    print(
        f"forward_backward: {len(datums)} datums, {fb_positions} tokens in {fb_s:.2f}s = "
        f"{fb_tps:.0f} tokens/s (max |learner - sampler| log-prob {diff_max:.2e})"
    )
    provider.close()
    extra = {}
    if args.vllm:  # the same workload on a vLLM server (bench/vllm_rollout.py)
        from vllm_rollout import vllm_rollout

        extra = vllm_rollout(
            args.vllm, args.model, args.temperature, prompts, args.group_size, args.new_tokens
        )
        extra["vllm_ratio"] = round(extra["vllm_tokens_per_s"] / ours_tps, 2)
    print(
        json.dumps(
            {
                **extra,
                "bench": "rollout",
                "model": args.model,
                "sequences": n_seqs,
                "new_tokens": args.new_tokens,
                "searchr1_tokens_per_s": round(ours_tps, 1),
                "baseline_tokens_per_s": round(base_tps, 1),
                "baseline_sequences": n_base,
                "ratio": round(ours_tps / base_tps, 2),
                "forward_backward_tokens_per_s": round(fb_tps, 1),
                "logprob_diff_max": diff_max,
                "torch_threads": torch.get_num_threads(),
                "machine": f"{platform.machine()} {os.cpu_count()} cpus, load "
                f"{os.getloadavg()[0]:.1f}",
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
