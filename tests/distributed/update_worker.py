"""Two optimizer steps of the tiny model's LoRA learner on fixed datums, as one rank of a
torchrun job (or alone): each rank trains on its share, with the whole batch's loss scale.
Rank 0 saves the LoRA parameters after the steps to ``argv[2]``. Run by test_torchrun.py."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from searchr1.core.config_schema import Config
from searchr1.core.distributed import World
from searchr1.core.types import AdamParams
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

# run as a script by torchrun: the shared test helpers are not on its path yet
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from numerics import random_datums  # noqa: E402

IS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)


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
        batch = random_datums(vocab, n, seed=step)
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
