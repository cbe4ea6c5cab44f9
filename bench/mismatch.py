"""Sampler/learner mismatch of the ``local`` provider on its own samples (one on-policy step).

    python bench/mismatch.py                  # builtin:tiny, fp32 and bf16, dropout 0 / 0.05
    python bench/mismatch.py --model PATH     # any causal LM folder
    python bench/mismatch.py --with-old       # also the old learner (dropout on when scoring)

For each setting the provider samples 8 prompts x 8 continuations at the reference setup's temperature
(0.8) with a non-zero LoRA adapter (B ~ N(0, 0.3^2): with B = 0 the adapter and its dropout
add nothing), turns them into datums with advantages +-1 and runs one ``forward_backward``:
the ``mismatch/*`` metrics it returns are what a training step logs. On-policy they would read
0 / ratio 1 with exact arithmetic; fp32 shows float noise, bf16 what its rounding costs (and
what ``[train.loss] ratio_cap`` is for). Prints one JSON line per setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def measure(
    model: str, dtype: str, dropout: float, seed: int = 0, dropout_on: bool = False
) -> dict:
    """One setting's mismatch. ``dropout_on`` scores in train mode (dropout active), the
    learner's behaviour before it scored with dropout off, for comparison."""
    import contextlib

    import torch

    from searchr1.core.config_schema import Config
    from searchr1.core.plugins import load_registry
    from searchr1.core.step_metrics import mismatch_means
    from searchr1.core.types import Datum, SamplingParams
    from searchr1.kit.learner import learner
    from searchr1.plugins.local_model.provider import LocalModelProvider
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    config = Config(assets=load_registry().assets).replace(
        model={"base_model": model, "temperature": 0.8, "dtype": dtype, "device": "cpu"},
        lora={"rank": 16, "alpha": 32.0, "dropout": dropout},
        run={"seed": seed},
    )
    config = dataclasses.replace(config, plugins={"model.local": {"threads": 0}})
    p = LocalModelProvider.from_config(config)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_((torch.randn(param.shape, generator=gen) * 0.3).to(param.dtype))
    rng = random.Random(seed)
    vocab = p.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(6, 20))] for _ in range(8)]
    params = SamplingParams(max_tokens=48, temperature=0.8, seed=seed)
    results = p.sampler.generate([(prompt, 8, params) for prompt in prompts])
    datums = []
    for prompt, samples in zip(prompts, results, strict=True):
        for i, s in enumerate(samples):
            tokens = prompt + list(s.tokens)
            lps = [0.0] * (len(prompt) - 1) + list(s.logprobs)
            adv = [0.0] * (len(prompt) - 1) + [1.0 if i % 2 else -1.0] * len(s.tokens)
            datums.append(Datum(tuple(tokens[:-1]), tuple(tokens[1:]), tuple(lps), tuple(adv)))
    loss = NamedLoss("importance_sampling", importance_sampling)
    original = learner.scoring_mode
    if dropout_on:

        @contextlib.contextmanager
        def train_mode(module):  # type: ignore[no-untyped-def]
            module.train()
            yield

        learner.scoring_mode = train_mode
    try:
        torch.manual_seed(seed)
        result = p.learner.forward_backward(datums, loss, loss_scale=1.0 / len(datums))
        m = mismatch_means(result.metrics)  # the means a training step logs
    finally:
        learner.scoring_mode = original
    p.close()
    keys = ("tokens", "logprob_diff_max", "kl_sample_train", "k3", "ratio_min", "ratio_max")
    return {
        "model": model,
        "dtype": dtype,
        "lora_dropout": dropout,
        "scored_with_dropout": dropout_on and dropout > 0,
        **{k: m[f"mismatch/{k}"] for k in keys},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument(
        "--with-old", action="store_true", help="also score with dropout on (the old learner)"
    )
    args = parser.parse_args()
    settings = [("float32", 0.0, False), ("float32", 0.05, False), ("bfloat16", 0.05, False)]
    if args.with_old:
        settings.append(("float32", 0.05, True))
    for dtype, dropout, dropout_on in settings:
        print(json.dumps(measure(args.model, dtype, dropout, dropout_on=dropout_on)), flush=True)


if __name__ == "__main__":
    main()
