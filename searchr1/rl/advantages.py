"""How a step's rewards become its update: the advantage estimators (:data:`ESTIMATORS`)
and the loss's aggregation (:func:`aggregation_weight`), under verl's and TRL's names
(docs/training.md maps each). An estimator sees the step's whole batch of groups (``G >= 2``
each), in float64, with each trajectory's sampled tokens. A *degenerate* group (all rewards
equal) gets advantage 0 from a group baseline, so the loop drops its datums.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEGENERATE_TOL = 1e-9
#: verl's constant in its masked mean's denominator and under its whitening's square root
WHITEN_EPS = 1e-8

Groups = Sequence[Sequence[float]]


@dataclass(frozen=True)
class AdvantageSettings:
    """The ``[train]`` settings an estimator reads."""

    #: ``"none"`` | ``"group"`` | ``"batch"``: what grpo divides by (TRL's ``scale_rewards``)
    scale_rewards: str = "none"
    #: added to that std (verl 1e-6, TRL 1e-4)
    eps: float = 1e-6


def is_degenerate(rewards: Sequence[float]) -> bool:
    """All rewards equal (within :data:`DEGENERATE_TOL`): no group baseline learns from it."""
    return max(rewards) - min(rewards) <= DEGENERATE_TOL


def grpo(rewards: Groups, tokens: Groups, s: AdvantageSettings) -> list[list[float]]:
    """``r_i - mean(group)``, divided by ``std + eps`` where ``s.scale_rewards`` says: the
    group's unbiased std (``"group"``: verl ``norm_adv_by_std_in_grpo``, TRL's default), the
    whole batch's (``"batch"``, TRL), or nothing (``"none"``, Dr. GRPO)."""
    batch = [r for g in rewards for r in g]
    batch_std = statistics.stdev(batch) if s.scale_rewards == "batch" else None
    out = []
    for g in rewards:
        mean = statistics.fmean(g)
        std = statistics.stdev(g) if s.scale_rewards == "group" else batch_std
        out.append([(r - mean) / (std + s.eps) if std is not None else r - mean for r in g])
    return out


def rloo(rewards: Groups, tokens: Groups, s: AdvantageSettings) -> list[list[float]]:
    """``r_i - mean(the group's other rewards)`` = ``G / (G - 1) * (r_i - mean(group))``."""
    return [[len(g) / (len(g) - 1) * (r - statistics.fmean(g)) for r in g] for g in rewards]


def opo(rewards: Groups, tokens: Groups, s: AdvantageSettings) -> list[list[float]]:
    """``r_i - b`` with the length-weighted baseline ``b = sum(n_j r_j) / sum(n_j)`` of the
    group, ``n_j`` its trajectories' sampled tokens (OPO, verl's ``opo``)."""
    out = []
    for g, n in zip(rewards, tokens, strict=True):
        baseline = math.fsum(nj * rj for nj, rj in zip(n, g, strict=True)) / math.fsum(n)
        out.append([r - baseline for r in g])
    return out


def gpg(rewards: Groups, tokens: Groups, s: AdvantageSettings) -> list[list[float]]:
    """``alpha * (r_i - mean(group))`` with ``alpha = B / (rewards of the batch that are not
    0)`` (at least 1), B the batch's trajectories (GPG, verl's ``gpg``)."""
    flat = [r for g in rewards for r in g]
    alpha = len(flat) / max(sum(r != 0 for r in flat), 1)
    return [[alpha * (r - statistics.fmean(g)) for r in g] for g in rewards]


def whiten(values: Groups, tokens: Groups) -> list[list[float]]:
    """verl's ``masked_whiten`` of a value held on each of a trajectory's sampled tokens:
    mean and unbiased variance over every sampled token of the batch (a trajectory weighs its
    token count), ``(v - mean) / sqrt(var + 1e-8)``, verl's 1e-8s kept."""
    n = math.fsum(t for ts in tokens for t in ts)
    if n < 2:
        raise ValueError(f"whitening needs at least 2 sampled tokens in the batch, got {n:g}")
    pairs = [
        (v, t) for vs, ts in zip(values, tokens, strict=True) for v, t in zip(vs, ts, strict=True)
    ]
    mean = math.fsum(v * t for v, t in pairs) / (n + WHITEN_EPS)
    var = math.fsum((v - mean) ** 2 * t for v, t in pairs) / (n + WHITEN_EPS) * n / (n - 1)
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    return [[(v - mean) * scale for v in vs] for vs in values]


def reinforce_plus_plus(rewards: Groups, tokens: Groups, s: AdvantageSettings) -> list[list[float]]:
    """REINFORCE++: the reward on every sampled token (gamma = 1), whitened over the batch:
    a batch baseline, no group one (a degenerate group's advantages are not 0)."""
    return whiten(rewards, tokens)


def reinforce_plus_plus_baseline(
    rewards: Groups, tokens: Groups, s: AdvantageSettings
) -> list[list[float]]:
    """REINFORCE++-baseline: ``r_i - mean(group)``, then whitened over the batch."""
    centred = [[0.0 if is_degenerate(g) else r - statistics.fmean(g) for r in g] for g in rewards]
    return whiten(centred, tokens)


Estimator = Callable[[Groups, Groups, AdvantageSettings], list[list[float]]]

#: ``[train] advantage_estimator`` -> the estimator (verl's ``algorithm.adv_estimator`` names)
ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "rloo": rloo,
    "opo": opo,
    "gpg": gpg,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
}

#: estimators whose baseline is the group's own: a degenerate group's advantages are 0
GROUP_BASELINES = frozenset({"grpo", "rloo", "opo", "gpg"})


def batch_advantages(
    name: str, rewards: Groups, tokens: Groups, settings: AdvantageSettings | None = None
) -> list[tuple[float, ...]]:
    """Each trajectory's advantage, group by group, by estimator ``name``: ``rewards`` and
    ``tokens`` (sampled tokens per trajectory) of the step's groups."""
    for g in rewards:
        if len(g) < 2:
            raise ValueError(f"a group needs at least 2 trajectories, got {len(g)}")
    out = ESTIMATORS[name](rewards, tokens, settings or AdvantageSettings())
    if name in GROUP_BASELINES:  # exactly 0, not a rounding residue of r - mean
        out = [[0.0] * len(a) if is_degenerate(g) else a for g, a in zip(rewards, out, strict=True)]
    return [tuple(a) for a in out]


#: ``[train] loss_agg_mode`` values (verl's ``actor.loss_agg_mode``)
LOSS_AGG_MODES = (
    "seq-mean-token-sum",
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregation_weight(
    mode: str, tokens: int, *, trajectories: int, batch_tokens: int, norm_tokens: int
) -> float:
    """What each token term of a trajectory with ``tokens`` sampled tokens is multiplied by,
    so that the step's loss, ``1 / trajectories`` times the weighted sum over every token of
    the batch, is verl's ``agg_loss`` over the whole batch in ``mode``:

    * ``seq-mean-token-sum``: ``sum_i sum_t l / N`` (weight 1);
    * ``token-mean``: ``sum_i sum_t l / T``, T the batch's sampled tokens (``batch_tokens``);
    * ``seq-mean-token-mean``: ``sum_i (sum_t l / n_i) / N``;
    * ``seq-mean-token-sum-norm``: ``sum_i sum_t l / (N * L)``, L = ``norm_tokens``
      (Dr. GRPO's constant: verl's ``loss_scale_factor``, TRL's ``max_completion_length``).
    """
    if mode == "seq-mean-token-sum":
        return 1.0
    if mode == "token-mean":
        return trajectories / max(batch_tokens, 1)
    if mode == "seq-mean-token-mean":
        return 1.0 / max(tokens, 1)
    if mode == "seq-mean-token-sum-norm":
        return 1.0 / norm_tokens
    raise ValueError(f"unknown loss_agg_mode {mode!r}; one of {', '.join(LOSS_AGG_MODES)}")
