"""Score a micro-batch whose rows share prefixes (a group's prompt) with each prefix run once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from searchr1.kit.learner.chunked_logprobs import (
    cache_kwarg,
    causal_lm,
    output_cache,
    project_logprobs,
)


def can_share_prefixes(model: Any) -> bool:
    """Whether ``model``'s layers are all full attention (a prefix's KV cache is all its
    state) with no sliding window."""
    config = causal_lm(model).config
    text = config.get_text_config()
    types = getattr(text, "layer_types", None) or ["full_attention"]
    sliding = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        sliding = None
    return all(t == "full_attention" for t in types) and sliding is None


def checkpointing(model: Any) -> bool:
    """Whether any layer of ``model`` recomputes its activations in backward."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def prefix_groups(
    inputs: Sequence[Sequence[int]], first_trained: Sequence[int], min_prefix: int = 8
) -> list[list[int]] | None:
    """Rows grouped by their untrained prefix ``inputs[b][:first_trained[b]]`` (identical
    tokens, identical length); ``None`` when no two rows share one of ``min_prefix`` or
    more tokens (nothing to save) or a row trains from its first position."""
    if min(first_trained, default=0) < 1:
        # An empty prefix would be a fully masked row in the prefix forward (NaN states).
        return None
    by_key: dict[tuple[int, ...], list[int]] = {}
    for b, (tokens, first) in enumerate(zip(inputs, first_trained, strict=True)):
        by_key.setdefault(tuple(tokens[:first]), []).append(b)
    groups = list(by_key.values())
    if not any(len(g) > 1 and first_trained[g[0]] >= min_prefix for g in groups):
        return None
    return groups


def first_sampled(tokens_sampled: Sequence[bool]) -> int:
    """The position of a row's first sampled token (its length if none): its prefix's length."""
    return next((i for i, s in enumerate(tokens_sampled) if s), len(tokens_sampled))


def decoder_tokens(
    inputs: Sequence[Sequence[int]], first_trained: Sequence[int], share: bool
) -> int:
    """Positions the decoder runs for these rows in one padded forward: rows x longest row,
    or, with ``share`` and rows that share prefixes (:func:`prefix_groups`), each distinct
    prefix once (padded to the longest) plus rows x longest rest."""
    whole = len(inputs) * max(map(len, inputs))
    groups = prefix_groups(inputs, first_trained) if share else None
    if groups is None:
        return whole
    prefix = max(first_trained[g[0]] for g in groups)
    rest = max(len(row) - f for row, f in zip(inputs, first_trained, strict=True))
    return len(groups) * prefix + len(inputs) * rest


def shared_prefix_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    lengths_B: Sequence[int],
    targets_BT: torch.Tensor,
    trained_BT: torch.Tensor,
    groups: list[list[int]],
    prefix_lengths: Sequence[int],
    temperature: float,
    chunk: int,
) -> torch.Tensor | None:
    """Log-probs at ``trained_BT`` (row-major, as ``x_BT[trained_BT]``) with each group's
    prefix (length ``prefix_lengths[g]``, the same tokens in every row of ``groups[g]``) run
    once. ``None`` if the model returned no cache (gradient checkpointing)."""
    if torch.is_grad_enabled() and checkpointing(model):
        return None  # transformers would drop the cache: the prefix forward would be wasted
    dev = input_ids_BT.device
    prefix_GL, prefix_mask_GL, group_B, start_B = _prefixes(input_ids_BT, groups, prefix_lengths)
    suffixes = _suffixes(input_ids_BT, lengths_B, targets_BT, trained_BT, start_B)
    if suffixes is None:
        return None  # nothing trained in any row
    suffix_BS, suffix_mask_BS, targets_BS, trained_BS = suffixes
    longest_suffix = suffix_BS.shape[1]
    decoder = causal_lm(model).get_decoder()
    cache_kw = cache_kwarg(decoder)
    out = decoder(input_ids=prefix_GL, attention_mask=prefix_mask_GL, use_cache=True)
    cache = output_cache(out)
    if cache is None:
        return None
    group_B = group_B.to(dev)
    cache.batch_select_indices(group_B)
    mask_BL = torch.cat([prefix_mask_GL[group_B], suffix_mask_BS], dim=1)
    start_B1 = torch.tensor(start_B, device=dev)[:, None]
    positions_BS = start_B1 + torch.arange(longest_suffix, device=dev)[None, :]
    hidden_BSH = decoder(
        input_ids=suffix_BS,
        attention_mask=mask_BL,
        position_ids=positions_BS,
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state
    return project_logprobs(
        model, hidden_BSH[trained_BS], targets_BS[trained_BS], temperature, chunk
    )


def _prefixes(
    input_ids_BT: torch.Tensor, groups: list[list[int]], prefix_lengths: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Each group's prefix once (``prefix_GL`` and its mask), each row's group and the
    position its own tokens start at."""
    dev, b = input_ids_BT.device, input_ids_BT.shape[0]
    longest_prefix = max(max(prefix_lengths), 1)
    prefix_GL = torch.zeros((len(groups), longest_prefix), dtype=torch.long, device=dev)
    prefix_mask_GL = torch.zeros_like(prefix_GL)
    group_B = torch.empty(b, dtype=torch.long)
    start_B = [0] * b
    for g, rows in enumerate(groups):
        n = prefix_lengths[g]
        prefix_GL[g, :n] = input_ids_BT[rows[0], :n]
        prefix_mask_GL[g, :n] = 1
        for r in rows:
            group_B[r], start_B[r] = g, n
    return prefix_GL, prefix_mask_GL, group_B, start_B


def _suffixes(
    input_ids_BT: torch.Tensor,
    lengths_B: Sequence[int],
    targets_BT: torch.Tensor,
    trained_BT: torch.Tensor,
    start_B: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Each row's tokens after its prefix, left-aligned: ids, mask, targets and the trained
    positions; None when no row has any."""
    dev, b = input_ids_BT.device, input_ids_BT.shape[0]
    longest_suffix = max(lengths_B[r] - start_B[r] for r in range(b))
    if longest_suffix == 0:
        return None
    suffix_BS = torch.zeros((b, longest_suffix), dtype=torch.long, device=dev)
    suffix_mask_BS = torch.zeros_like(suffix_BS)
    targets_BS = torch.zeros_like(suffix_BS)
    trained_BS = torch.zeros((b, longest_suffix), dtype=torch.bool, device=dev)
    for r in range(b):
        lo, hi = start_B[r], lengths_B[r]
        suffix_BS[r, : hi - lo] = input_ids_BT[r, lo:hi]
        suffix_mask_BS[r, : hi - lo] = 1
        targets_BS[r, : hi - lo] = targets_BT[r, lo:hi]
        trained_BS[r, : hi - lo] = trained_BT[r, lo:hi]
    return suffix_BS, suffix_mask_BS, targets_BS, trained_BS
