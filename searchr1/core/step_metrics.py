"""Per-step metrics of the train loop, as flat ``name -> float`` dicts.

The train loop calls :func:`rollout_metrics` after scoring a step's trajectories and merges
in search counters (prefixed ``search/``), training results and timings before logging one
``metrics`` event per step.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from searchr1.core.types import RewardResult, Trajectory

END_REASONS = ("answered", "search_limit", "turn_limit", "token_limit", "invalid_action")


def rollout_metrics(
    trajectories: Sequence[Trajectory], rewards: Sequence[RewardResult]
) -> dict[str, float]:
    """``reward/mean``, ``reward/<component>`` means, searches and turns per trajectory,
    ``end_reason/<reason>`` rates and ``tokens/sampled``."""
    n = len(trajectories)
    if n == 0:
        return {}
    out: dict[str, float] = {"reward/mean": statistics.fmean(r.reward for r in rewards)}
    components = sorted({name for r in rewards for name in r.components})
    for name in components:
        out[f"reward/{name}"] = statistics.fmean(r.components.get(name, 0.0) for r in rewards)
    out["searches_per_trajectory"] = statistics.fmean(t.search_calls for t in trajectories)
    out["search_rate"] = sum(t.search_calls > 0 for t in trajectories) / n
    out["turns_per_trajectory"] = statistics.fmean(len(t.turns) for t in trajectories)
    reasons = Counter(t.end_reason for t in trajectories)
    for reason in END_REASONS:
        out[f"end_reason/{reason}"] = reasons.get(reason, 0) / n
    out["tokens/sampled"] = float(sum(sum(t.generated_mask) for t in trajectories))
    out["tokens/trajectory_mean"] = statistics.fmean(len(t.tokens) for t in trajectories)
    return out


def prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
