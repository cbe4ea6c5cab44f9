"""Per-step metrics of the train loop, as flat ``name -> float`` dicts (what each key means,
when it is logged and how it merges: :mod:`searchr1.core.metric_schema`)."""

from __future__ import annotations

import math
import resource
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence

from searchr1.core.metric_schema import merge
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import RewardResult, Trajectory

END_REASONS = ("answered", "search_limit", "turn_limit", "token_limit", "invalid_action")


def rollout_metrics(
    trajectories: Sequence[Trajectory], rewards: Sequence[RewardResult]
) -> dict[str, float]:
    """``reward/mean``, ``reward/<component>`` means (over the trajectories reporting it),
    searches per trajectory, ``end_reason/<reason>`` rates and the trajectories' mean length.
    A trajectory's turns are its searches + 1 and its sampled tokens are
    ``health/response_tokens``: neither is repeated here."""
    n = len(trajectories)
    if n == 0:
        return {}
    out: dict[str, float] = {"reward/mean": statistics.fmean(r.reward for r in rewards)}
    components = sorted({name for r in rewards for name in r.components})
    for name in components:  # over the trajectories that report it (judge_vs_em: the judged)
        out[f"reward/{name}"] = statistics.fmean(
            r.components[name] for r in rewards if name in r.components
        )
    out["searches_per_trajectory"] = statistics.fmean(t.search_calls for t in trajectories)
    out["search_rate"] = sum(t.search_calls > 0 for t in trajectories) / n
    reasons = Counter(t.end_reason for t in trajectories)
    for reason in END_REASONS:
        out[f"end_reason/{reason}"] = reasons.get(reason, 0) / n
    out["tokens/trajectory_mean"] = statistics.fmean(len(t.tokens) for t in trajectories)
    return out


#: each ``mismatch/*`` sum a learner reports, and the mean over ``mismatch/tokens`` the core
#: derives from it after the merge (:func:`mismatch_means`)
MISMATCH_SUMS = {"kl_sample_train_sum": "kl_sample_train", "k3_sum": "k3"}


def mismatch_from_logprobs(learner: Sequence[float], sampler: Sequence[float]) -> dict[str, float]:
    """``mismatch/*`` sums and extremes from paired per-token log-probs of trained tokens,
    ``d = learner - sampler``, in plain Python (for providers whose learner is a service)::

        mismatch/tokens                trained tokens the sums are over
        mismatch/logprob_diff_max      max |d|
        mismatch/kl_sample_train_sum   sum(-d)                (sampler minus learner)
        mismatch/k3_sum                sum(exp(d) - 1 - d)    (k3 estimator of KL, >= 0)
        mismatch/ratio_min / _max      min / max exp(d)
    """
    d = [float(a) - float(b) for a, b in zip(learner, sampler, strict=True)]
    if not d:
        return {"mismatch/tokens": 0.0}
    # math.exp raises past ~709 nats; a broken sampler's gap must show as inf, not stop training
    ratios = [math.exp(x) if x < 709.0 else math.inf for x in d]
    return {
        "mismatch/tokens": float(len(d)),
        "mismatch/logprob_diff_max": max(abs(x) for x in d),
        "mismatch/kl_sample_train_sum": -math.fsum(d),
        "mismatch/k3_sum": math.fsum(r - 1.0 - x for r, x in zip(ratios, d, strict=True)),
        "mismatch/ratio_min": min(ratios),
        "mismatch/ratio_max": max(ratios),
    }


def displacement_from_logprobs(responses: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """``displacement/*`` sums of one step from ``(group id, mean log-prob per sampled token
    before the update, the same after it)`` of each positively-rewarded response the step
    trained (for any provider that can score them after its optimizer step)::

        displacement/responses    responses measured
        displacement/before_sum   sum of their mean log-probs before the update
        displacement/after_sum    the same after it
        displacement/groups       groups with a measured response
        displacement/fell_groups  groups whose responses' mean log-prob fell (on average)

    :func:`displacement_metrics` derives the logged means from the merged sums."""
    by_group: dict[str, list[float]] = {}
    for group, before, after in responses:
        by_group.setdefault(group, []).append(after - before)
    if not responses:
        return {}
    return {
        "displacement/responses": float(len(responses)),
        "displacement/before_sum": math.fsum(b for _, b, _ in responses),
        "displacement/after_sum": math.fsum(a for _, _, a in responses),
        "displacement/groups": float(len(by_group)),
        "displacement/fell_groups": float(sum(statistics.fmean(d) < 0 for d in by_group.values())),
    }


def displacement_metrics(train_metrics: Mapping[str, float]) -> dict[str, float]:
    """``displacement/logprob_before``, ``displacement/logprob_after``, ``displacement/delta``
    (after - before: below 0, the update pushed the positive responses *down*) and
    ``displacement/fell_group_frac`` from a step's merged ``displacement/*`` sums; empty when
    the trainer measured none (a remote service, or no positive response)."""
    n = train_metrics.get("displacement/responses", 0.0)
    if not n:
        return {}
    before = train_metrics["displacement/before_sum"] / n
    after = train_metrics["displacement/after_sum"] / n
    groups = train_metrics.get("displacement/groups", 0.0)
    fell = train_metrics.get("displacement/fell_groups", 0.0)
    return {
        "displacement/logprob_before": before,
        "displacement/logprob_after": after,
        "displacement/delta": after - before,
        "displacement/fell_group_frac": fell / groups if groups else 0.0,
    }


def llds_metrics(train_metrics: Mapping[str, float]) -> dict[str, float]:
    """``llds/penalty`` (the LLDS regularizer's unweighted penalty per trained token) and
    ``llds/active_frac`` (share of trained tokens it penalised) from a step's merged learner
    sums; empty when the regularizer is off (``[model.local] llds_coef = 0``)."""
    if "llds_sum" not in train_metrics:
        return {}
    tokens = train_metrics.get("tokens", 0.0)
    return {
        "llds/penalty": train_metrics["llds_sum"] / tokens if tokens else 0.0,
        "llds/active_frac": train_metrics.get("llds_tokens", 0.0) / tokens if tokens else 0.0,
    }


#: the SDK's name for :func:`~searchr1.core.metric_schema.merge` (a learner merges its
#: micro-batches' sums and extremes with it; the means are derived once after the merge)
merge_train_metrics = merge


def mismatch_means(train_metrics: Mapping[str, float]) -> dict[str, float]:
    """A step's merged learner metrics with each ``mismatch/*`` sum (:data:`MISMATCH_SUMS`)
    replaced by its mean over the trained tokens of its scope: ``mismatch/k3_sum`` becomes
    ``mismatch/k3 = k3_sum / mismatch/tokens``, a sampling server's ``mismatch/server<k>/k3_sum``
    becomes ``mismatch/server<k>/k3`` over ``mismatch/server<k>/tokens``. A scope that trained
    no token has no mean."""
    out: dict[str, float] = {}
    for key, value in train_metrics.items():
        scope, _, name = key.rpartition("/")
        if not (key.startswith("mismatch/") and name in MISMATCH_SUMS):
            out[key] = value
        elif tokens := train_metrics.get(f"{scope}/tokens", 0.0):
            out[f"{scope}/{MISMATCH_SUMS[name]}"] = value / tokens
    return out


def ratio_metrics(train_metrics: Mapping[str, float]) -> dict[str, float]:
    """``ratio_mean`` (``ratio_sum / tokens``, 1 when nothing trained) and, for a loss that
    clips its ratio (its learner sums ``clipped_tokens``), ``clip_fraction``, from a step's
    merged learner sums."""
    tokens = train_metrics.get("tokens", 0.0)
    out = {"ratio_mean": train_metrics.get("ratio_sum", 0.0) / tokens if tokens else 1.0}
    if "clipped_tokens" in train_metrics:
        out["clip_fraction"] = train_metrics["clipped_tokens"] / tokens if tokens else 0.0
    return out


def logprob_diff_max(metrics: Mapping[str, float], scope: str = "mismatch") -> float | None:
    """The largest |learner - sampler| log-prob of a step, from the ratio extremes its
    ``metrics`` event logs (``<scope>/ratio_min``, ``<scope>/ratio_max``), or None without
    them."""
    low, high = metrics.get(f"{scope}/ratio_min"), metrics.get(f"{scope}/ratio_max")
    if low is None or high is None:
        return None
    return max(math.log(high) if high > 0 else math.inf, -math.log(low) if low > 0 else math.inf)


def kl_metrics(train_metrics: Mapping[str, float]) -> dict[str, float]:
    """``kl/mean`` (the KL term's k3 per token it read) and ``kl/max`` from a step's merged
    learner sums; empty when the loss has no KL term (``[train.loss] kl_coef = 0``)."""
    if "kl_sum" not in train_metrics:
        return {}
    tokens = train_metrics.get("kl_tokens", 0.0)
    return {
        "kl/mean": train_metrics["kl_sum"] / tokens if tokens else 0.0,
        "kl/max": train_metrics.get("kl_max", 0.0),
    }


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GiB (``ru_maxrss`` counts KiB on Linux,
    bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**30 if sys.platform == "darwin" else 2**20), 3)


def prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


def ratio_basis(sampler_temperature: float, learner_temperature: float | None) -> str:
    """The start-of-run sentence saying what the importance ratio compares (the train loop's
    ``importance_ratio`` event). ``learner_temperature`` is the temperature at which the
    trainer scores tokens (:attr:`~searchr1.core.types.TrainerCapabilities.learner_temperature`),
    None when the trainer does not know it (a remote service)."""
    ts = f"{sampler_temperature:g}"
    if learner_temperature is not None and learner_temperature == sampler_temperature:
        return (
            f"importance ratio = learner / sampler probability, both at temperature {ts}: "
            "1 on-policy; mismatch/* reports any drift"
        )
    tl = f"{learner_temperature:g}" if learner_temperature is not None else "the service's own"
    return (
        f"importance ratio compares the learner's probabilities at temperature {tl} with the "
        f"sampler's at {ts}: on-policy ratios need not be 1 (a remote service may score "
        "untempered log-probs); mismatch/* in each step's metrics shows the size"
    )


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
