"""The learner's peak memory and speed at the real Qwen3.5 vocabulary: old path vs chunked.

    python bench/learner_memory.py                  # seed-like batch, vocabulary 248,320
    python bench/learner_memory.py --vocab 65536 --datums 8 --prompt 120 --chunk 64  # CI

One training step (``Learner.forward_backward`` with the importance-sampling loss, then
``optim_step``) of a tiny random Qwen3.5 (Gated DeltaNet hybrid, hidden 128, 4 layers, tied
embeddings, LoRA rank 16 on all linear layers) with the real 248,320-token vocabulary, on
seed-like datums: ``--datums`` rows of a long prompt, two sampled turns of 16 tokens with a
60-token observation between them, the rows' turns starting at three different offsets (so
the union of trained columns over the micro-batch is ~1.5x each row's trained tokens, as in
the issue's probe), all in one micro-batch.

Each path runs in its own subprocess: ``old`` (the learner's fallback for a model whose
logits the chunked path does not reproduce: the model's own forward, B x K x V logits over the
union K of trained columns) and ``new`` (each row's trained positions, ``--chunk`` positions
per vocabulary projection). A warm-up step on two datums comes first (first-call
costs, optimizer state); then the peak is reset (``/proc/self/clear_refs`` on Linux, so
``VmHWM`` restarts at the current RSS; on CUDA ``reset_peak_memory_stats``) and the timed
steps run. ``extra_mb`` = peak minus the memory in use just before the first timed step.

Prints ONE JSON line: per path ``extra_mb``, ``peak_mb``, ``step_s`` (best of ``--steps``),
``tokens_per_s`` (every datum position, prompt included), ``loss``; then
``extra_ratio`` (new / old, target <= 0.25), ``speedup`` (new tokens/s / old, target >= 1)
and ``loss_abs_diff``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parent.parent
TURN, OBSERVATION, OFFSETS = 16, 60, (0, 4, 8)


def datums(count: int, prompt: int, vocab: int) -> list[Any]:
    """Seed-like rows: prompt, turn, observation, turn; only the turns are trained."""
    import torch

    from searchr1.core.types import Datum

    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        head = prompt + OFFSETS[i % len(OFFSETS)]
        n = head + TURN + OBSERVATION + TURN
        tokens = torch.randint(3, vocab, (n + 1,), generator=gen).tolist()
        trained = [False] * head + [True] * TURN + [False] * OBSERVATION + [True] * TURN
        adv = 1.0 if i % 2 else -1.0
        logprobs = (-torch.rand(n, generator=gen) * 8).tolist()
        out.append(
            Datum(
                input_tokens=tuple(tokens[:-1]),
                target_tokens=tuple(tokens[1:]),
                sampler_logprobs=tuple(
                    lp if t else 0.0 for lp, t in zip(logprobs, trained, strict=True)
                ),
                advantages=tuple(adv if t else 0.0 for t in trained),
                trajectory_id=f"mem-{i}",
            )
        )
    return out


def build_model(vocab: int, device: Any) -> Any:
    import torch
    import transformers as tf

    from searchr1.core.config_schema import Config
    from searchr1.kit.learner.loading import attach_lora

    config = tf.Qwen3_5TextConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=True,  # as Qwen3.5-4B
        max_position_embeddings=4096,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = tf.AutoModelForCausalLM.from_config(config).to(device)
    run_config = Config().replace(
        model={"base_model": "qwen3.5-tiny", "temperature": 1.0},
        lora={"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": ("all-linear",)},
    )
    return attach_lora(base, run_config)


class Peak:
    """Peak memory since :meth:`reset`: CUDA's allocator on a GPU, ``VmHWM`` on the CPU."""

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"

    def current_mb(self) -> float:
        import torch

        if self.cuda:
            return torch.cuda.memory_allocated() / 2**20
        return _status_kb("VmRSS") / 1024

    def reset(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        # Linux: writing 5 resets the peak RSS (VmHWM) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def peak_mb(self) -> float:
        import torch

        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return _status_kb("VmHWM") / 1024


def _status_kb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (not Linux?)")


def run_path(args: Any) -> dict[str, Any]:
    """One path (``args.mode``) in this process."""
    import torch

    from searchr1.core.types import AdamParams
    from searchr1.kit.learner.learner import Learner
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.vocab, device)
    learner = Learner(
        model,
        device=device,
        model_lock=threading.Lock(),
        context_length=4096,
        vocab_size=args.vocab,
        temperature=1.0,
        pad_token_id=0,
        chunk_tokens=65536,  # the whole batch in one micro-batch, as the reference setup's up to 64k
        logit_chunk=args.chunk,
    )
    if args.mode == "old":
        learner._chunked_ok = False  # as after a failed logits check: the fallback path
    batch = datums(args.datums, args.prompt, args.vocab)
    loss = NamedLoss("importance_sampling", importance_sampling)
    adam = AdamParams(learning_rate=1e-6)
    learner.forward_backward(batch[:2], loss, 1.0)  # warm-up
    learner.optim_step(adam)
    meter = Peak(device)
    before = meter.current_mb()
    meter.reset()
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        result = learner.forward_backward(batch, loss, 1.0 / len(batch))
        learner.optim_step(adam)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(result.loss)
    peak = meter.peak_mb()
    tokens = sum(len(d) for d in batch)
    return {
        "mode": args.mode,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "chunked": bool(learner._chunked_ok),
        "before_mb": round(before, 1),
        "peak_mb": round(peak, 1),
        "extra_mb": round(peak - before, 1),
        "step_s": round(min(times), 3),
        "tokens_per_s": round(tokens / min(times), 1),
        "loss": losses[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("both", "old", "new"), default="both")
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--datums", type=int, default=19)
    parser.add_argument("--prompt", type=int, default=330, help="prompt tokens per datum")
    parser.add_argument("--chunk", type=int, default=256, help="learner_logit_chunk (new)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps (best is kept)")
    # 1 by default: on a shared, busy CPU two OpenMP threads ran a step 10x slower than one.
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.mode != "both":
        print(json.dumps(run_path(args)))
        return
    results = {}
    for mode in ("old", "new"):
        argv = [a for a in sys.argv[1:] if not a.startswith("--mode")]
        proc = subprocess.run(
            [sys.executable, __file__, "--mode", mode, *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            sys.exit(f"learner_memory.py --mode {mode} failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{mode}: {results[mode]}", file=sys.stderr)
    batch = datums(args.datums, args.prompt, 8)
    trained = sum(sum(1 for a in d.advantages if a != 0) for d in batch)
    columns = len({i for d in batch for i, a in enumerate(d.advantages) if a != 0})
    old, new = results["old"], results["new"]
    report = {
        "bench": "learner_memory",
        "vocab": args.vocab,
        "datums": args.datums,
        "tokens": sum(len(d) for d in batch),
        "trained_tokens": trained,
        "union_columns": columns,
        "chunk": args.chunk,
        "old": old,
        "new": new,
        "extra_ratio": round(new["extra_mb"] / max(old["extra_mb"], 1e-9), 3),
        "speedup": round(new["tokens_per_s"] / old["tokens_per_s"], 3),
        # The loss is a mean over datums of sums of +-ratio: absolute, not relative.
        "loss_abs_diff": abs(new["loss"] - old["loss"]),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
