"""Two optimizer steps of the tiny model's LoRA learner on fixed datums, as one rank of a
torchrun job (or alone): each rank trains on its share, with the whole batch's loss scale.
Rank 0 saves the LoRA parameters after the steps to ``argv[2]``. Run by test_torchrun.py."""

from __future__ import annotations

import random
import sys

import torch

from searchr1.core.config_schema import Config
from searchr1.core.distributed import World
from searchr1.core.types import AdamParams, Datum
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

IS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)


def datums(vocab: int, n: int, seed: int) -> list[Datum]:
    """Datums of different lengths: a prompt (advantage 0) then 'generated' tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, gen = rng.randint(3, 10), rng.randint(4, 20)
        seq = [rng.randrange(3, vocab) for _ in range(prompt + gen)]
        adv = rng.choice([-1.0, 0.5, 1.0])
        out.append(
            Datum(
                tuple(seq[:-1]),
                tuple(seq[1:]),
                tuple([0.0] * (prompt - 1) + [rng.uniform(-7, -5) for _ in range(gen)]),
                tuple([0.0] * (prompt - 1) + [adv] * gen),
                trajectory_id=f"traj-{seed}-{i}",
            )
        )
    return out


def main(model_dir: str, out: str) -> None:
    world = World.from_env()
    config = Config().replace(
        model={"base_model": model_dir, "temperature": 0.9, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    provider = LocalModelProvider.from_config(config)
    vocab = provider.model.config.vocab_size
    # step 1: five datums over the ranks; step 2: one datum, so one rank has none
    for step, n in ((1, 5), (2, 1)):
        batch = datums(vocab, n, seed=step)
        mine = world.shard(batch)
        if mine:
            provider.forward_backward(mine, IS, loss_scale=1.0 / len(batch))
        provider.optim_step(ADAM)
    if world.main:
        lora = {
            k: v.detach().clone() for k, v in provider.model.named_parameters() if v.requires_grad
        }
        torch.save(lora, out)
    world.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
