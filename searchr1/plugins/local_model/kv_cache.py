"""Row surgery on a transformers cache: select rows, trim or add padding, append rows.

Used by :mod:`searchr1.plugins.local_model.sampler` to keep one running batch compact
(finished rows leave, columns that every remaining row masks are cut), to admit requests
that arrive while a batch is decoding (the narrower cache is left-padded, then the rows are
appended) and to keep a finished row's cache for its trajectory's next turn
(:mod:`.reuse`). Every row carries explicit position ids and an attention mask, so padding
columns, wherever they are, change nothing for attention layers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

_FULL = {"DynamicLayer"}
_LINEAR = {"LinearAttentionLayer"}
_HYBRID = {"LinearAttentionAndFullAttentionLayer"}


def layer_kind(layer: Any) -> str:
    """``full``, ``linear``, ``hybrid`` or ``other`` (see the module docstring)."""
    name = type(layer).__name__
    if getattr(layer, "record_past", False):
        return "other"
    if name in _FULL:
        return "full" if _has_keys(layer) else "other"
    if name in _LINEAR:
        return "linear"
    if name in _HYBRID:
        return "hybrid" if _has_keys(layer) else "other"
    return "other"


def _has_keys(layer: Any) -> bool:
    keys = getattr(layer, "keys", None)
    return (
        bool(getattr(layer, "is_initialized", False))
        and isinstance(keys, torch.Tensor)
        and keys.dim() == 4
    )


def editable(cache: Any) -> bool:
    """True when every layer is ``full``, ``linear`` or ``hybrid`` (the sampler's fast path)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(layer_kind(layer) != "other" for layer in layers)


def has_state_layers(cache: Any) -> bool:
    """True when some layer carries recurrent state (a prompt must then never be padded in
    the middle: a padding token would still decay the state)."""
    return any(layer_kind(layer) in ("linear", "hybrid") for layer in cache.layers)


def _states(layer: Any) -> Iterator[tuple[dict[int, Any], int]]:
    """The initialised per-row state tensors of a linear layer, as (dict, key) slots."""
    for slots, flags in (
        (layer.conv_states, layer.is_conv_states_initialized),
        (layer.recurrent_states, layer.is_recurrent_states_initialized),
    ):
        for key, ready in flags.items():
            if ready and isinstance(slots.get(key), torch.Tensor):
                yield slots, key


def select_rows(cache: Any, idx: torch.Tensor) -> None:
    """Keep rows ``idx`` (in that order; an index may repeat, which copies a row)."""
    for layer in cache.layers:
        kind = layer_kind(layer)
        if kind == "other":
            if hasattr(layer, "batch_select_indices"):
                layer.batch_select_indices(idx)
            else:
                layer.reorder_cache(idx)
            continue
        if kind in ("full", "hybrid"):
            layer.keys = layer.keys.index_select(0, idx.to(layer.keys.device))
            layer.values = layer.values.index_select(0, idx.to(layer.values.device))
        if kind in ("linear", "hybrid"):
            for slots, key in _states(layer):
                slots[key] = slots[key].index_select(0, idx.to(slots[key].device))


def trim_left(cache: Any, columns: int) -> None:
    """Drop the first ``columns`` positions of every row (all masked)."""
    if columns <= 0:
        return
    for layer in cache.layers:
        if layer_kind(layer) in ("full", "hybrid"):
            layer.keys = layer.keys[..., columns:, :]
            layer.values = layer.values[..., columns:, :]


def pad_left(cache: Any, columns: int) -> None:
    """Prepend ``columns`` zero positions to every row (to be masked by the caller)."""
    if columns <= 0:
        return
    for layer in cache.layers:
        if layer_kind(layer) in ("full", "hybrid"):
            layer.keys = _pad(layer.keys, columns)
            layer.values = _pad(layer.values, columns)


def _pad(t: torch.Tensor, columns: int) -> torch.Tensor:
    b, h, _, d = t.shape
    return torch.cat([t.new_zeros((b, h, columns, d)), t], dim=-2)


def append_rows(cache: Any, other: Any) -> None:
    """Append ``other``'s rows (same width) after ``cache``'s rows."""
    for layer, extra in zip(cache.layers, other.layers, strict=True):
        kind = layer_kind(layer)
        if kind in ("full", "hybrid"):
            layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
            layer.values = torch.cat([layer.values, extra.values], dim=0)
        if kind in ("linear", "hybrid"):
            for (slots, key), (extra_slots, extra_key) in zip(
                _states(layer), _states(extra), strict=True
            ):
                slots[key] = torch.cat([slots[key], extra_slots[extra_key]], dim=0)


def nbytes(cache: Any) -> int:
    """Bytes the cache's tensors hold now (what the memory-budget test measures)."""
    seen: set[int] = set()
    total = 0
    for layer in cache.layers:
        for t in _tensors(layer):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _tensors(layer: Any) -> Iterator[torch.Tensor]:
    for value in vars(layer).values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            yield value
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, torch.Tensor) and v.dim() > 0)


def copy_rows(cache: Any, idx: torch.Tensor) -> Any:
    """A new cache holding rows ``idx`` of ``cache`` (which is left as it is); only for an
    :func:`editable` cache."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        if layer_kind(layer) in ("linear", "hybrid"):
            twin.conv_states = dict(layer.conv_states)
            twin.recurrent_states = dict(layer.recurrent_states)
            twin.is_conv_states_initialized = dict(layer.is_conv_states_initialized)
            twin.is_recurrent_states_initialized = dict(layer.is_recurrent_states_initialized)
            twin.has_previous_state = dict(layer.has_previous_state)
        out.layers.append(twin)
    select_rows(out, idx)
    return out
