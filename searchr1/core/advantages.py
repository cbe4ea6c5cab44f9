"""Group-relative advantages (GRPO style), over complete groups, before micro-batching:

A_i = r_i - mean(r_1..r_G)                      (default)
A_i = (r_i - mean(r)) / (std(r) + eps)          (train.scale_advantages_by_std)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEGENERATE_TOL = 1e-9


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: tuple[float, ...]
    degenerate: bool


def group_advantages(
    rewards: Sequence[float], *, scale_by_std: bool = False, eps: float = 1e-6
) -> GroupAdvantages:
    """Advantages of one group of trajectories of the same question (``len(rewards) >= 2``;
    module docstring)."""
    if len(rewards) < 2:
        raise ValueError(f"a group needs at least 2 trajectories, got {len(rewards)}")
    mean = statistics.fmean(rewards)
    degenerate = max(rewards) - min(rewards) <= DEGENERATE_TOL
    if degenerate:
        return GroupAdvantages(tuple(0.0 for _ in rewards), True)
    centred = [r - mean for r in rewards]
    if scale_by_std:
        std = statistics.stdev(rewards)  # unbiased: / (G - 1)
        centred = [c / (std + eps) for c in centred]
    return GroupAdvantages(tuple(centred), False)
