"""Rollout throughput of the ``local`` model provider.

    python bench/rollout.py               # 64 sequences x 128 new tokens; generate() loop on all 64
    python bench/rollout.py --quick       # same, the generate() loop timed on 8 sequences
    python bench/rollout.py --multi-turn  # also: 3-turn trajectories with cache reuse off / on
    python bench/rollout.py --quick --vllm .venv-vllm/bin/python  # also: the vllm provider

Sections (each a function, so another provider's variant can sit beside them):

* provider: what the rollout does, 8 questions x group 8 issued as concurrent
  ``sample(prompt, num_samples=8)`` calls from asyncio tasks, with per-request seeds;
* ``generate`` loop: ``model.generate`` per sequence on the same model object, every sampling
  parameter explicit (``do_sample=True, top_k=0, top_p=1.0``); a per-sequence rate, so timing
  it on a subset (``--quick``) estimates the same rate;
* bare loop: the limit of this model on this machine, a KV-cached batched forward loop over
  the same 64 rows (argmax, no bookkeeping). ``decode_efficiency`` = provider tokens/s / bare
  loop tokens/s, measured in the same run;
* forward_backward: the 64 sampled sequences as datums (importance-sampling loss), in
  micro-batches of 32 as the train loop sends them;
* ``--multi-turn``: each trajectory samples a turn, gets a synthetic observation, samples
  again (``turns`` times), all trajectories concurrently as the rollout drives them; run with
  cache reuse off (every turn prefills its whole history) and on. ``prefill_tokens`` counts
  the prompt tokens fed to the model; ``prefill_tokens_min`` = distinct first prompts +
  observations + one token per later turn (the previous turn's last token, never fed);
  ``prefill_ratio`` = their quotient (target <= 1.1).

Ends by printing one JSON line with every figure.
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
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SYSTEM = (
    "Answer the question. Search with <search> query </search>, answer with <answer> x </answer>."
)
OBSERVATION = (
    "\n<information> Doc 1 (The old mountain town) The town was described in a book by a writer "
    "who lived there for many years. Doc 2 (Writers) Many writers lived in the mountain towns. "
    "</information>\n"
)


def load_provider(model: str, temperature: float, **local: Any) -> Any:
    import dataclasses

    from searchr1.core.config_schema import Config
    from searchr1.core.plugins import load_registry
    from searchr1.plugins.local_model.provider import LocalModelProvider

    config = Config(assets=load_registry().assets).replace(
        model={"base_model": model, "temperature": temperature}, lora={"dropout": 0.0}
    )
    if local:
        config = dataclasses.replace(config, plugins={"model.local": local})
    return LocalModelProvider.from_config(config)


def make_prompts(tok: Any, questions: int) -> list[list[int]]:
    return [
        tok.encode(
            tok.apply_chat_template(
                [
                    {"role": "system", "content": SYSTEM},
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
        for q in range(questions)
    ]


def run_provider(provider: Any, prompts: list[list[int]], group: int, new_tokens: int, temp: float):
    """One rollout-shaped batch; returns (results, tokens/s, tokens, seconds)."""
    from searchr1.core.types import SamplingParams

    async def rollout() -> list:
        return await asyncio.gather(
            *[
                provider.sample(
                    p, group, SamplingParams(max_tokens=new_tokens, temperature=temp, seed=q)
                )
                for q, p in enumerate(prompts)
            ]
        )

    asyncio.run(provider.sample(prompts[0], 2, SamplingParams(max_tokens=4)))  # warm-up
    t0 = time.perf_counter()
    results = asyncio.run(rollout())
    seconds = time.perf_counter() - t0
    tokens = sum(len(s.tokens) for g in results for s in g)
    return results, tokens / seconds, tokens, seconds


def run_generate_loop(provider: Any, prompts: list[list[int]], n: int, group: int, args: Any):
    """``model.generate`` per sequence: (tokens/s, tokens, seconds)."""
    import torch

    model, tok = provider.model, provider.tokenizer
    kw = dict(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=args.temperature,
        max_new_tokens=args.new_tokens,
        pad_token_id=tok.pad_token_id,
    )
    tokens = 0
    with torch.inference_mode():
        model.eval()
        ids = torch.tensor([prompts[0]], device=provider.device)
        model.generate(ids, attention_mask=torch.ones_like(ids), **{**kw, "max_new_tokens": 4})
        t0 = time.perf_counter()
        for i in range(n):
            ids = torch.tensor([prompts[i // group % len(prompts)]], device=provider.device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            tokens += out.shape[1] - ids.shape[1]
        seconds = time.perf_counter() - t0
    return tokens / seconds, tokens, seconds


def run_bare_loop(provider: Any, prompts: list[list[int]], group: int, new_tokens: int):
    """KV-cached batched argmax decoding of every row, no bookkeeping: (tokens/s, tokens)."""
    import torch

    model, dev = provider.model, provider.device
    rows = [p for p in prompts for _ in range(group)]
    width = max(len(p) for p in rows)
    pad = provider.tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=dev)
    kw = provider.sampler.forward.cache_kw
    with torch.inference_mode():
        model.eval()
        t0 = time.perf_counter()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
        nxt = pos[:, -1:] + 1
        for _ in range(new_tokens):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            cache = getattr(out, "cache", None) or out.past_key_values
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=nxt,
                use_cache=True,
                **{kw: cache},
            )
            nxt = nxt + 1
        seconds = time.perf_counter() - t0
    tokens = len(rows) * new_tokens
    return tokens / seconds, tokens


def run_forward_backward(provider: Any, prompts: list[list[int]], results: list):
    """(tokens/s, max |learner - sampler| log-prob) over the sampled sequences."""
    from searchr1.core.types import Datum
    from searchr1.plugins.losses import NamedLoss, importance_sampling

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

    async def passes() -> list[Any]:
        chunks = [datums[start : start + 32] for start in range(0, len(datums), 32)]
        queued = [await provider.forward_backward(c, loss, len(c) / len(datums)) for c in chunks]
        return [await q for q in queued]

    for r in asyncio.run(passes()):
        diff_max = max(diff_max, r.metrics.get("mismatch/logprob_diff_max", 0.0))
    seconds = time.perf_counter() - t0
    provider.learner.optimizer.zero_grad(set_to_none=True)
    return sum(len(d) for d in datums) / seconds, diff_max


def run_multi_turn(
    provider: Any, prompts: list[list[int]], group: int, new_tokens: int, turns: int, temp: float
) -> dict[str, float]:
    """Trajectories of ``turns`` sampled turns with a synthetic observation between them."""
    from searchr1.core.types import SamplingParams

    obs = provider.tokenizer.encode(OBSERVATION)
    stats = provider.sampler.stats
    minimum = sum(len(p) for p in prompts)

    async def trajectory(history: list[int], first: Any, seed: int) -> int:
        nonlocal minimum
        sample, generated = first, len(first.tokens)
        for turn in range(1, turns):
            history = history + list(sample.tokens) + obs
            minimum += len(obs) + 1
            params = SamplingParams(max_tokens=new_tokens, temperature=temp, seed=seed * 100 + turn)
            (sample,) = await provider.sample(history, 1, params)
            generated += len(sample.tokens)
        return generated

    async def rollout() -> int:
        async def question(q: int, p: list[int]) -> int:
            params = SamplingParams(max_tokens=new_tokens, temperature=temp, seed=q)
            first = await provider.sample(p, group, params)
            counts = await asyncio.gather(
                *[trajectory(p, s, q * group + k) for k, s in enumerate(first)]
            )
            return sum(counts)

        return sum(await asyncio.gather(*[question(q, p) for q, p in enumerate(prompts)]))

    provider.sampler.forget()
    before = stats.prefill_tokens
    t0 = time.perf_counter()
    generated = asyncio.run(rollout())
    seconds = time.perf_counter() - t0
    prefill = stats.prefill_tokens - before
    return {
        "prefill_tokens": prefill,
        "prefill_tokens_min": minimum,
        "prefill_ratio": round(prefill / minimum, 3),
        "tokens_per_s": round(generated / seconds, 1),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="generate() loop on 8 sequences")
    parser.add_argument("--model", default="builtin:tiny-random", help="base_model to load")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--baseline-seqs", type=int, default=0, help="0: 8 if --quick else all")
    parser.add_argument(
        "--threads", type=int, default=0, help="[model.local] threads (1 on a loaded machine)"
    )
    parser.add_argument("--reps", type=int, default=2, help="provider/bare-loop alternations")
    parser.add_argument("--multi-turn", action="store_true", help="add the multi-turn section")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=48, help="new tokens per turn")
    parser.add_argument("--vllm", default="", help="also time vLLM, launched from this Python")
    args = parser.parse_args()

    import torch

    provider = load_provider(args.model, args.temperature, threads=args.threads)
    prompts = make_prompts(provider.tokenizer, args.questions)
    group, n_seqs = args.group_size, args.questions * args.group_size
    report: dict[str, Any] = {"bench": "rollout", "model": args.model, "sequences": n_seqs}
    report["new_tokens"] = args.new_tokens
    load_before = os.getloadavg()[0]

    # Provider and bare loop alternate, best of --reps each: on a shared machine the load
    # changes from one minute to the next, and the efficiency must compare like with like.
    best: tuple = ()
    bare_tps = 0.0
    for _ in range(args.reps):
        run = run_provider(provider, prompts, group, args.new_tokens, args.temperature)
        best = max(best, run, key=lambda r: r[1]) if best else run
        bare_tps = max(bare_tps, run_bare_loop(provider, prompts, group, args.new_tokens)[0])
    results, ours_tps, ours_tokens, ours_s = best
    print(
        f"searchr1 provider: {n_seqs} seqs, {ours_tokens} tokens in {ours_s:.2f}s = "
        f"{ours_tps:.0f} tokens/s"
    )
    print(f"bare KV-cached batched argmax loop: {bare_tps:.0f} tokens/s")
    print(f"decode_efficiency: {ours_tps / bare_tps:.2f}")
    n_base = args.baseline_seqs or (8 if args.quick else n_seqs)
    base_tps, base_tokens, base_s = run_generate_loop(provider, prompts, n_base, group, args)
    print(
        f"per-sequence generate loop: {n_base} seqs, {base_tokens} tokens in {base_s:.2f}s = {base_tps:.0f} tokens/s"
    )
    fb_tps, diff_max = run_forward_backward(provider, prompts, results)
    print(
        f"forward_backward: {fb_tps:.0f} tokens/s (max |learner - sampler| log-prob {diff_max:.2e})"
    )
    report.update(
        searchr1_tokens_per_s=round(ours_tps, 1),
        bare_loop_tokens_per_s=round(bare_tps, 1),
        decode_efficiency=round(ours_tps / bare_tps, 3),
        baseline_tokens_per_s=round(base_tps, 1),
        baseline_sequences=n_base,
        ratio=round(ours_tps / base_tps, 2),
        forward_backward_tokens_per_s=round(fb_tps, 1),
        logprob_diff_max=diff_max,
    )
    if args.multi_turn:
        for label, reuse in (("before", False), ("after", True)):
            provider.sampler.reuse = reuse
            mt = run_multi_turn(
                provider, prompts, group, args.turn_tokens, args.turns, args.temperature
            )
            print(f"multi-turn, cache reuse {'on' if reuse else 'off'} ({label}): {mt}")
            report[f"multi_turn_{label}"] = mt
        report["prefill_tokens"] = report["multi_turn_after"]["prefill_tokens"]
        report["prefill_tokens_min"] = report["multi_turn_after"]["prefill_tokens_min"]
        report["prefill_ratio"] = report["multi_turn_after"]["prefill_ratio"]
    provider.close()
    if args.vllm:  # the same workload on a vLLM server (bench/vllm_rollout.py)
        from vllm_rollout import vllm_rollout

        report.update(
            vllm_rollout(args.vllm, args.model, args.temperature, prompts, group, args.new_tokens)
        )
        report["vllm_ratio"] = round(report["vllm_tokens_per_s"] / ours_tps, 2)
    report.update(
        torch_threads=torch.get_num_threads(),
        machine=f"{platform.machine()} {os.cpu_count()} cpus, load "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}",
        python=sys.version.split()[0],
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
