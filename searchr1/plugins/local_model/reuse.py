"""Caches kept between a trajectory's turns, so a later turn does not prefill its history.

The rollout's next turn of a trajectory asks for ``prompt + sampled tokens + observation``
(the :class:`~searchr1.core.types.Sampler` interface stays token-in/token-out). When a
row of the sampler stops, :class:`RetainedCaches` keeps a one-row copy of its cache, keyed by
the tokens that cache holds (the prompt and every sampled token but the last, which was
never fed). A new request whose prompt starts with such a key takes that cache over and only
its new tokens are prefilled (:mod:`.generation`); the match is exact, so a re-tokenized or
edited history simply misses and is prefilled in full.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

import searchr1.plugins.local_model.kv_cache as kv_cache


@dataclass(eq=False)
class Retained:
    """One row's cache: it holds ``length`` real tokens; ``mask_L`` marks them among its
    columns; ``next_pos`` is the position of the next token."""

    cache: Any
    mask_L: torch.Tensor
    length: int
    next_pos: int
    stateful: bool  # has recurrent-state layers (see generation.Forward.prefill)

    @property
    def tokens(self) -> int:
        """Cache positions it holds (its width)."""
        return int(self.mask_L.shape[0])


class RetainedCaches:
    """Least-recently-used map from token prefixes to one-row caches."""

    def __init__(self, row_tokens: int = 0) -> None:
        self.row_tokens = row_tokens  # added to each entry's width (its recurrent state)
        self._entries: OrderedDict[tuple[int, ...], Retained] = OrderedDict()
        self._lengths: dict[int, int] = {}  # key length -> number of entries of that length
        self.tokens = 0  # cache positions held by all entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: tuple[int, ...], entry: Retained) -> None:
        self._drop(key)
        self._entries[key] = entry
        self._lengths[len(key)] = self._lengths.get(len(key), 0) + 1
        self.tokens += entry.tokens + self.row_tokens

    def take(self, prompt: list[int]) -> Retained | None:
        """Remove and return the entry with the longest key that is a proper prefix of
        ``prompt`` (at least one new token must be left to prefill)."""
        for n in sorted(self._lengths, reverse=True):
            if n >= len(prompt):
                continue
            key = tuple(prompt[:n])
            if key in self._entries:
                entry = self._entries[key]
                self._drop(key)
                return entry
        return None

    def evict_oldest(self) -> bool:
        """Drop the least recently stored entry; False when there is none."""
        if not self._entries:
            return False
        self._drop(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0

    def nbytes(self) -> int:
        return sum(kv_cache.nbytes(e.cache) for e in self._entries.values())

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.tokens -= entry.tokens + self.row_tokens
        left = self._lengths[len(key)] - 1
        if left:
            self._lengths[len(key)] = left
        else:
            del self._lengths[len(key)]


def retain_row(batch_cache: Any, row: int, mask_RL: torch.Tensor, next_pos: int) -> Retained:
    """A one-row copy of row ``row`` of a running batch's cache, its leading padding cut."""
    cache = kv_cache.copy_rows(batch_cache, torch.tensor([row], device=mask_RL.device))
    mask_L = mask_RL[row]
    lead = int(mask_L.long().argmax()) if bool(mask_L.any()) else 0
    kv_cache.trim_left(cache, lead)
    mask_L = mask_L[lead:]
    return Retained(
        cache=cache,
        mask_L=mask_L,
        length=int(mask_L.sum()),
        next_pos=next_pos,
        stateful=kv_cache.has_state_layers(cache),
    )
