"""Two optimizer steps of the tiny model's LoRA learner on fixed datums, as one rank of a
torchrun job (or alone): each rank trains on its share, with the whole batch's loss scale.
Rank 0 saves the LoRA parameters after the steps to ``argv[2]``, and the steps' gradient
norms as ``grad_norm`` (the update of AdamW barely depends on the gradients' scale). Run by test_torchrun.py
and test_fsdp.py.

``argv[3]``, optional: ``kl`` trains with a KL term toward a reference pinned before the
first step, one micro-batch per datum; ``fsdp`` does the same with ``[model.local] fsdp``
and gradient checkpointing, samples between the steps (rank ``r`` ``r + 1`` requests:
unequal work), rank 0 also saves a checkpoint folder to ``argv[2] + ".state"``, and every
rank loads it back (into zeroed shards) and rank 0 checks the weights are the saved ones.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from searchr1.core.config_schema import Config
from searchr1.core.distributed import World
from searchr1.core.types import AdamParams, SamplingParams
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

# run as a script by torchrun: the shared test helpers are not on its path yet
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from numerics import random_datums  # noqa: E402
from trainer_calls import load_state, train_step  # noqa: E402

IS = NamedLoss("importance_sampling", importance_sampling)
IS_KL = NamedLoss("importance_sampling", importance_sampling, {"kl_coef": 0.5})
ADAM = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)


def main(model_dir: str, out: str, mode: str = "") -> None:
    world = World.from_env()
    fsdp = mode == "fsdp"
    config = Config().replace(
        model={"base_model": model_dir, "temperature": 0.9, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    if fsdp:
        local = {"fsdp": True, "gradient_checkpointing": True}
        config = config.replace(plugins={**config.plugins, "model.local": local})
    provider = LocalModelProvider.from_config(config)
    vocab = provider.model.config.vocab_size
    loss = IS_KL if mode else IS
    if mode:
        provider.learner.pin_reference()  # the adapter as it starts (lora_B = 0)
    norms = []
    # step 1: five datums over the ranks; step 2: one datum, so one rank has none
    for step, n in ((1, 5), (2, 1)):
        batch = random_datums(vocab, n, seed=step)
        mine = world.shard(batch)
        scale = 1.0 / len(batch)
        if mode:  # one micro-batch a datum: the ranks run different numbers of them
            micro_batches = [([d], scale) for d in mine]
        else:
            micro_batches = [(mine, scale)] if mine else []
        results, metrics = train_step(provider, micro_batches, loss, ADAM)
        norms.append(metrics["grad_norm"])
        assert all(r.loss == r.loss for r in results)  # awaited after the step (FSDP: filled)
        if fsdp and step == 1:
            asyncio.run(_sample_unequal(provider, world.rank))
    if world.main:  # under FSDP the weights are whole between steps
        named = dict(provider.model.named_parameters())
        saved = {n: named[n].detach().clone() for n in provider.learner.param_names}
        saved["grad_norm"] = torch.tensor(norms, dtype=torch.float64)
        torch.save(saved, out)
        if fsdp:
            provider.save_state(out + ".state")
    if fsdp:  # every rank loads its shards back from rank 0's whole files
        world.broadcast(None)  # written
        with torch.no_grad():
            for p in provider.learner.params:
                p.to_local().zero_()
        load_state(provider, out + ".state")
        named = dict(provider.model.named_parameters())
        saved = torch.load(out) if world.main else {}
        for n in saved.keys() - {"grad_norm"}:
            assert torch.equal(named[n].detach(), saved[n]), n
        assert provider.learner.step == 2
    world.close()


async def _sample_unequal(provider: LocalModelProvider, rank: int) -> None:
    """Rank ``r`` samples ``r + 1`` times, of different lengths: a sharded model that
    needed every rank in each forward would hang here."""
    for i in range(rank + 1):
        params = SamplingParams(max_tokens=4 + 3 * i, temperature=1.0, seed=i)
        await provider.sample([5, 6, 7, 8], 2, params)


if __name__ == "__main__":
    main(*sys.argv[1:])
