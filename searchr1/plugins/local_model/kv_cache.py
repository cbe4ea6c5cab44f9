"""Batch surgery on a transformers ``DynamicCache``: drop rows, trim padding, add rows.

Used by :mod:`searchr1.plugins.local_model.sampler` to keep one running batch compact
(finished rows leave, columns that every remaining row masks are cut) and to admit requests
that arrive while a batch is decoding (their prefilled cache is left-padded or the running
one is, to a common width, then the rows are appended). Every row carries explicit position
ids and an attention mask, so padding columns, wherever they are, change nothing.

Only plain full-attention layers (``DynamicLayer``) can be edited this way; for any other
cache (sliding windows, offloading, other transformers versions) :func:`editable` is False
and the sampler falls back to dropping rows with ``batch_select_indices`` only.
"""

from __future__ import annotations

from typing import Any

import torch


def editable(cache: Any) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(
        type(layer).__name__ == "DynamicLayer"
        and getattr(layer, "is_initialized", False)
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and layer.keys.dim() == 4
        for layer in layers
    )


def width(cache: Any) -> int:
    return int(cache.layers[0].keys.shape[-2])


def trim_left(cache: Any, columns: int) -> None:
    """Drop the first ``columns`` positions of every row (all masked)."""
    if columns <= 0:
        return
    for layer in cache.layers:
        layer.keys = layer.keys[..., columns:, :]
        layer.values = layer.values[..., columns:, :]


def pad_left(cache: Any, columns: int) -> None:
    """Prepend ``columns`` zero positions to every row (to be masked by the caller)."""
    if columns <= 0:
        return
    for layer in cache.layers:
        b, h, _, d = layer.keys.shape
        layer.keys = torch.cat([layer.keys.new_zeros((b, h, columns, d)), layer.keys], dim=-2)
        b, h, _, d = layer.values.shape
        layer.values = torch.cat([layer.values.new_zeros((b, h, columns, d)), layer.values], dim=-2)


def append_rows(cache: Any, other: Any) -> None:
    """Append ``other``'s rows (same width) after ``cache``'s rows."""
    for layer, extra in zip(cache.layers, other.layers, strict=True):
        layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
        layer.values = torch.cat([layer.values, extra.values], dim=0)
