"""One rank of a torchrun job sampling a float64 FSDP2-sharded tiny model twice with the same
seeds: first gathered whole (``Sharding.for_sampling``), then sharded, in lockstep
(``fsdp.Lockstep``). Each rank has its own requests (rank ``r``: ``r + 1`` prompts of
different lengths, one call where rank 0 has none), so the ranks run different numbers of
forwards. Saves this rank's samples of both ways, how many decoder layers were ever whole
at once in each, and the lockstep idle forwards to ``argv[2]/rank{r}.pt``. Run by
test_lockstep.py.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import torch

from searchr1.core.config_schema import Config
from searchr1.core.distributed import World
from searchr1.core.types import SamplingParams
from searchr1.kit.learner.fsdp import Lockstep, is_sharded, shard_model
from searchr1.kit.learner.loading import LocalSettings, load_lora_model
from searchr1.plugins.local_model.sampler import BatchedSampler


def requests(rank: int, call: int) -> list[tuple[list[int], int, SamplingParams]]:
    """Rank ``rank``'s requests of call ``call``: unequal work on purpose."""
    if call == 1 and rank == 0:
        return []  # rank 0 only joins the others' forwards
    out = []
    for i in range(rank + 1):
        prompt = [(7 * rank + 3 * i + k) % 600 + 5 for k in range(4 + 23 * i + 9 * rank)]
        params = SamplingParams(
            max_tokens=6 + 5 * i + 3 * rank + 4 * call,
            temperature=0.0 if i == 1 else 1.0,
            top_p=0.8 if i == 2 else 1.0,
            seed=100 * rank + 10 * call + i,
        )
        out.append((prompt, 1 + (i + rank) % 3, params))
    return out


def whole_layers(layers: list[Any]) -> int:
    """How many decoder layers hold their whole weights now (FSDP2 swaps a unit's DTensor
    parameters for plain whole tensors while it is gathered)."""
    return sum(not any(is_sharded(p) for p in layer.parameters()) for layer in layers)


def main(model_dir: str, out: str) -> None:
    world = World.from_env()
    config = Config().replace(
        model={"base_model": model_dir, "temperature": 1.0, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    model, tokenizer, device, _ = load_lora_model(config, LocalSettings())
    gen = torch.Generator().manual_seed(3)  # a nonzero adapter: sampling must use it
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1
    sharding = shard_model(model, device)
    layers = list(sharding.units[:-1])  # the decoder layers (the root is last)
    peak = {"now": 0}

    def note(*_: Any) -> None:
        peak["now"] = max(peak["now"], whole_layers(layers))

    for layer in layers:
        # after FSDP's own pre-forward hook (registered first), which gathers the layer
        layer.register_forward_pre_hook(note)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def sampler(lockstep: Lockstep | None) -> BatchedSampler:
        return BatchedSampler(
            model,
            tokenizer,
            device=device,
            model_lock=threading.Lock(),
            context_length=int(model.config.max_position_embeddings),
            eos_token_ids=[],  # no early stop: the lengths are the requests' own
            pad_token_id=pad,
            vocab_size=int(model.config.vocab_size),
            prefill_chunk_tokens=16,  # several prefill forwards for the longer prompts
            lockstep=lockstep,
        )

    result: dict[str, Any] = {}
    sharding.for_sampling()
    gathered = sampler(None)
    result["gather"] = [gathered.generate(requests(world.rank, c)) for c in (0, 1)]
    result["gather_whole_layers"] = peak["now"]
    sharding.for_learning()
    peak["now"] = 0
    lockstep = Lockstep(model, device, pad)
    stepped = sampler(lockstep)
    result["lockstep"] = [stepped.generate(requests(world.rank, c)) for c in (0, 1)]
    result["lockstep_whole_layers"] = peak["now"]
    result["idle_forwards"] = lockstep.idle_forwards
    result["layers"] = len(layers)
    result["sharded_after"] = all(is_sharded(p) for layer in layers for p in layer.parameters())
    # the learner's forward/backward still works on weights gathered under inference_mode
    model.train()
    ids = torch.tensor([[5, 6, 7, 8]], device=device)
    model(input_ids=ids).logits.sum().backward()
    result["trains_after"] = all(
        p.grad is not None for n, p in model.named_parameters() if "lora_B" in n
    )
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(result, Path(out) / f"rank{world.rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
