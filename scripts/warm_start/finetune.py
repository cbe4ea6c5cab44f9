"""The warm start's supervised fine-tune: full-parameter AdamW on scripted episodes.

The loss covers the assistant's tokens only (as RL does), so the model never trains on a
document of the demo world and cannot memorise its facts, held-out or not; only episodes of
the separate *reading* world also weigh their observations (``read_weight``).
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Sequence
from typing import Any

from warm_start.scripted_agent import Episode


def finetune(
    model: Any,
    episodes: Sequence[Episode],
    *,
    pad_id: int,
    steps: int,
    batch_size: int = 32,
    lr: float = 2e-3,
    warmup: int = 20,
    seed: int = 0,
    log_every: int = 25,
    read_weight: float = 0.0,
) -> list[float]:
    """Full-parameter supervised fine-tune on the episodes' assistant tokens.

    AdamW with linear warm-up and cosine decay; batches are drawn by a seeded shuffle, epoch
    after epoch. Returns the loss of every step."""
    import torch

    from searchr1.core.logs import get_logger

    log = get_logger()
    gen = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches: list[list[Episode]] = []
    prefix = _shared_prefix(episodes)
    losses: list[float] = []
    model.train()
    start = time.monotonic()
    for step in range(steps):
        if not batches:
            batches = _shuffled_batches(episodes, batch_size, gen)
        loss = _assistant_loss(model, batches.pop(), pad_id, prefix, read_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = losses[-log_every:]
            log.info(
                "warm_start.step",
                step=step + 1,
                loss=round(sum(recent) / len(recent), 4),
                elapsed_s=round(time.monotonic() - start, 1),
            )
    model.eval()
    return losses


def _shuffled_batches(
    episodes: Sequence[Episode], batch_size: int, gen: random.Random
) -> list[list[Episode]]:
    """One epoch of batches in random order. Deliberately not bucketed by length: length
    tells a guess from a search, and batches of only one behaviour swing the first-token
    decision from batch to batch instead of learning its rate."""
    order = list(range(len(episodes)))
    gen.shuffle(order)
    return [
        [episodes[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)
    ][::-1]


def _shared_prefix(episodes: Sequence[Episode]) -> int:
    """Length of the token prefix every episode starts with (the instruction part of the
    prompt), minus one so each episode keeps at least its own first token."""
    first = episodes[0].tokens
    n = min(len(e.tokens) for e in episodes) - 1
    for e in episodes:
        while n > 0 and e.tokens[:n] != first[:n]:
            n -= 1
    return max(n, 0)


def _assistant_loss(
    model: Any, batch: Sequence[Episode], pad_id: int, prefix: int = 0, read_weight: float = 0.0
) -> Any:
    """Weighted mean cross-entropy of the assistant's tokens (weight 1) and, in reading
    episodes, of the observation tokens (``read_weight``).

    Two savings that do not change the loss: the ``prefix`` tokens every episode shares (the
    protocol's long instruction, most of a short episode) are run once and their keys and
    values reused by the whole batch, and the vocabulary projection is applied only at the
    positions that predict an assistant token (a few per episode)."""
    import torch
    from transformers import DynamicCache

    width = max(len(e.tokens) for e in batch) - prefix
    rows = len(batch)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, prefix + width), dtype=torch.long)
    attn[:, :prefix] = 1
    weight = torch.zeros((rows, width), dtype=torch.float32)
    for row, e in enumerate(batch):
        n = len(e.tokens) - prefix
        ids[row, :n] = torch.tensor(e.tokens[prefix:])
        attn[row, prefix : prefix + n] = 1
        weight[row, :n] = torch.tensor(e.train_mask[prefix:], dtype=torch.float32)
        if e.reading and read_weight > 0:
            weight[row, :n] += read_weight * torch.tensor(
                e.observation_mask[prefix:], dtype=torch.float32
            )
    if any(e.train_mask[prefix] or e.observation_mask[prefix] for e in batch):
        raise ValueError("an assistant token right after the shared prefix is not supported")
    cache = None
    if prefix:
        head = torch.tensor([batch[0].tokens[:prefix]])
        cache = model.model(input_ids=head, use_cache=True).past_key_values
        cache.batch_repeat_interleave(rows)
    assert cache is None or isinstance(cache, DynamicCache)
    positions = torch.arange(prefix, prefix + width).unsqueeze(0).expand(rows, -1)
    with warnings.catch_warnings():  # newer transformers renamed past_key_values -> cache
        warnings.simplefilter("ignore", FutureWarning)
        hidden = model.model(
            input_ids=ids,
            attention_mask=attn,
            past_key_values=cache,
            position_ids=positions,
            use_cache=cache is not None,
        ).last_hidden_state
    # Position t predicts token t + 1.
    w = weight[:, 1:]
    predict = w > 0
    logits = model.lm_head(hidden[:, :-1][predict])
    ce = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][predict], reduction="none")
    return (ce * w[predict]).sum() / w[predict].sum()
