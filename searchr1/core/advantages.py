"""Group-relative advantages (GRPO style), over complete groups, before micro-batching:

    A_i = r_i - mean(r_1..r_G)                      (default)
    A_i = (r_i - mean(r)) / (std(r) + eps)          (train.scale_advantages_by_std)

``std`` is the unbiased sample standard deviation, ``sqrt(sum (r_i - mean)^2 / (G - 1))``, as
verl (``torch.std``, ``eps = 1e-6``), TRL and Search-R1 compute it; the population one would
make every scaled advantage ``sqrt(G / (G - 1))`` larger (1.069 at ``G = 8``). A group needs
``G >= 2`` trajectories (``rollout.group_size`` is at least 2): one trajectory has no baseline
and no spread, so :func:`group_advantages` refuses it with a ``ValueError`` rather than
return a zero or a NaN.

A group whose rewards are all equal is *degenerate*: every A_i is 0, so it teaches nothing;
the loop counts it (``degenerate_group_rate``) and drops its datums.
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
