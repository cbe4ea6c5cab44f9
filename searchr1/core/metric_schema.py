"""The numbers a training step logs, declared: every key of the ``metrics`` event belongs to
one :class:`MetricGroup` of :data:`SCHEMA`, which says what kind of number it is, when it is
emitted and how values of several parts (ranks, learner batches) merge into one.

The kinds (:class:`Kind`): docs/architecture.md, "Metrics: a declared schema".
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal


class Kind(enum.Enum):
    CURVE = "per-step curve"
    SPARSE = "sparse diagnostic (steps where it is not 0)"
    MODE = "mode-only"
    TOTAL = "run total (in `train_done`)"
    CONSTANT = "constant (the config: the run's hparams)"
    DERIVED = "not logged (another key gives it)"


#: how the values of several parts (micro-batches, ranks, calls) merge (:func:`merge`):
#: ``per_call`` is the mean weighted by the part's ``calls`` (the key's own prefix:
#: ``search/calls``); ``recomputed``: the step computes it once from the merged learner sums
#: (``ratio_mean = ratio_sum / tokens``), parts that carry it sum; ``scoped``: as the key
#: without its middle part (``mismatch/server0/k3_sum`` as ``mismatch/k3_sum``)
Merge = Literal["sum", "mean", "min", "max", "last", "per_call", "recomputed", "scoped"]


@dataclass(frozen=True)
class Metric:
    """One key (``<name>`` matches a part that varies) and what it means; ``merge`` overrides
    its group's rule."""

    key: str
    meaning: str
    merge: Merge | None = None


@dataclass(frozen=True)
class MetricGroup:
    """Keys that one producer reports together, under one condition."""

    name: str
    kind: Kind
    #: when the group is in the event, in words (the docs' "when")
    when: str
    merge: Merge
    metrics: tuple[Metric, ...]
    #: the loop mode a ``mode`` group needs (``pipelined``), None: its producer's presence
    mode: str | None = None


def _g(
    name: str,
    kind: Kind,
    when: str,
    merge: Merge,
    *metrics: tuple[str, str] | Metric,
    mode: str | None = None,
) -> MetricGroup:
    rows = tuple(m if isinstance(m, Metric) else Metric(*m) for m in metrics)
    return MetricGroup(name, kind, when, merge, rows, mode)


CURVE, SPARSE, MODE, TOTAL = Kind.CURVE, Kind.SPARSE, Kind.MODE, Kind.TOTAL
CONSTANT, DERIVED = Kind.CONSTANT, Kind.DERIVED

#: every group, in the docs' order; a key belongs to the first group with a matching key
SCHEMA: tuple[MetricGroup, ...] = (
    _g(
        "step",
        CURVE,
        "every step",
        "last",
        ("step", "the RL step (1-based)"),
        ("world_size", "processes of the torchrun job (only under torchrun); the other numbers count every rank's"),
    ),
    _g(
        "rewards",
        CURVE,
        "every step",
        "mean",
        ("reward/mean", "mean reward of the first draw (an unbiased sample of the policy)"),
        ("reward/trained_mean", "mean reward of the groups trained (after dynamic sampling)"),
        ("reward/judge_vs_em", "with an LLM judge: share of judged trajectories where the judge's verdict agrees with exact match"),
        Metric("reward/judge_fallbacks", "with an LLM judge: trajectories scored by `[reward.judge] fallback` because the judge gave no verdict", "sum"),
        ("reward/<component>", "mean of a reward component over the trajectories reporting it: `format` (answered in the format), `correct` (exact match), `f1` (token F1, a metric only), and any shaping term's"),
        ("degenerate_group_rate", "share of the first draw's groups whose rewards are all equal: no gradient"),
        Metric("draws/extra", "extra questions dynamic sampling drew to replace degenerate groups", "sum"),
    ),
    _g(
        "behaviour",
        CURVE,
        "every step",
        "mean",
        ("search_rate", "share of trajectories that searched at least once"),
        ("searches_per_trajectory", "mean searches per trajectory (a trajectory's assistant turns are its searches + 1)"),
        ("tokens/trajectory_mean", "mean length of a trajectory, prompt and search results included"),
    ),
    _g(
        "end reasons",
        SPARSE,
        "steps where some trajectory ended so",
        "mean",
        ("end_reason/<reason>", "share of trajectories that ended `answered`, at the `search_limit`, the `turn_limit`, the `token_limit`, or with an `invalid_action`"),
    ),
    _g(
        "update constants",
        CONSTANT,
        "never (the config holds them)",
        "last",
        ("optim/lr", "the learning rate: `[optimizer] lr`"),
        ("optim/step", "the adapter's version: the step plus the cold start's steps"),
    ),
    _g(
        "update",
        CURVE,
        "every step (`optim/*`: every step with an update)",
        "sum",
        ("tokens/trained", "tokens that entered the loss (non-zero advantage, or a KL term)"),
        ("loss", "the policy loss summed over micro-batches"),
        Metric("ratio_mean", "mean importance ratio learner / sampler over trained tokens: `ratio_sum / tokens` of the learners' merged sums", "recomputed"),
        Metric("optim/grad_norm", "the gradient norm of the optimizer step, before clipping", "last"),
        Metric("optim/<name>", "another number a trainer's optimizer step reports", "last"),
    ),
    _g(
        "clipping",
        CURVE,
        "the loss clips its ratio (the learner reports clipped tokens)",
        "recomputed",
        ("clip_fraction", "share of trained tokens whose ratio the loss clipped: `clipped_tokens / tokens` of the learners' merged sums"),
    ),
    _g(
        "kl",
        CURVE,
        "`[train.loss] kl_coef > 0`",
        "recomputed",
        ("kl/mean", "the KL term's k3 estimate per token it read (policy vs the start policy)"),
        Metric("kl/max", "the largest per-token k3 of the step", "max"),
        Metric("groups", "groups trained (a KL term keeps degenerate groups too; without one it is `[rollout] questions_per_batch`)", "sum"),
    ),
    _g(
        "likelihood displacement",
        CURVE,
        "a trainer that measures it (the local learner: `[model.local] likelihood_displacement`), on steps that trained a positively-rewarded response",
        "recomputed",
        ("displacement/logprob_before", "mean log-prob per sampled token of the step's positively-rewarded (advantage > 0) responses under the policy before the update"),
        ("displacement/logprob_after", "the same under the policy after the update (one extra forward without gradient)"),
        ("displacement/delta", "after - before: below 0, the update made the responses it rewards less likely (likelihood displacement; alert `likelihood_displacement`)"),
        ("displacement/fell_group_frac", "share of the groups with a positive response whose positive responses' mean log-prob fell"),
    ),
    _g(
        "displacement sums",
        DERIVED,
        "never",
        "sum",
        ("displacement/responses", "positive responses measured (the trainer's sum; the means above are over it)"),
        ("displacement/before_sum", "sum of their mean log-probs before the update"),
        ("displacement/after_sum", "the same after it"),
        ("displacement/groups", "groups with a measured response"),
        ("displacement/fell_groups", "groups whose positive responses' likelihood fell"),
    ),
    _g(
        "llds",
        CURVE,
        "`[model.local] llds_coef > 0`",
        "recomputed",
        ("llds/penalty", "the LLDS regularizer's unweighted penalty per trained token: sum of max(0, sampler - learner log-prob) over the tokens it regularizes, over `tokens/trained`"),
        ("llds/active_frac", "share of trained tokens the LLDS regularizer penalised"),
    ),
    _g(
        "learner sums",
        DERIVED,
        "never (the step's means are derived from them)",
        "sum",
        ("tokens", "trained tokens a learner's loss read (`tokens/trained`)"),
        ("ratio_sum", "sum of the importance ratios over them (`ratio_mean`)"),
        Metric("ratio_max", "the largest importance ratio", "max"),
        ("clipped_tokens", "tokens whose ratio the loss clipped (`clip_fraction`)"),
        ("truncated_tokens", "tokens whose ratio passed the loss's cap"),
        ("nll_sum", "the cold start's summed negative log-likelihood"),
        ("kl_sum", "sum of the KL term's k3 over the tokens it read (`kl/mean`)"),
        ("kl_tokens", "tokens the KL term read"),
        Metric("kl_max", "the largest k3 of the KL term (`kl/max`)", "max"),
        ("llds_sum", "the LLDS penalty summed over trained tokens (`llds/penalty`)"),
        ("llds_tokens", "tokens the LLDS regularizer penalised (`llds/active_frac`)"),
    ),
    _g(
        "mismatch weights",
        DERIVED,
        "never",
        "sum",
        ("mismatch/tokens", "trained tokens the mismatch numbers are over (`tokens/trained`)"),
        ("mismatch/kl_sample_train_sum", "sum of sampler minus learner log-prob over them (`mismatch/kl_sample_train` is its mean)"),
        ("mismatch/k3_sum", "sum of the k3 estimates over them (`mismatch/k3` is its mean)"),
        Metric("mismatch/logprob_diff_max", "largest |learner - sampler| log-prob: max(ln `ratio_max`, -ln `ratio_min`)", "max"),
    ),
    _g(
        "mismatch",
        CURVE,
        "the learner reports log-probs",
        "mean",
        ("mismatch/kl_sample_train", "mean sampler log-prob minus learner log-prob over trained tokens"),
        ("mismatch/k3", "mean k3 KL estimate, sampler vs learner"),
        Metric("mismatch/ratio_min", "smallest per-token ratio learner / sampler", "min"),
        Metric("mismatch/ratio_max", "largest per-token ratio", "max"),
        Metric("mismatch/server<k>/<name>", "the same numbers for sampling server k of a sampler with several servers (in the order of `api_bases`)", "scoped"),
    ),
    _g(
        "health",
        CURVE,
        "every step",
        "last",
        ("health/response_tokens", "sampled tokens per trajectory (x trajectories: the step's sampled tokens)"),
        ("health/response_growth", "that over its mean across the first `baseline_steps`"),
        ("health/format_rate", "share of trajectories answered in the protocol's format (the console's `format`)"),
        ("health/repeat_ngram_rate", "share of sampled n-grams already seen earlier in the same trajectory"),
        ("health/entropy", "mean -log p of the sampled tokens (an entropy estimate)"),
        ("health/searches/<data_source>", "searches per question of each data source"),
        ("health/follow_up_searches", "searches after the first, per question (a search agent's second hop)"),
    ),
    _g(
        "health diagnostics",
        SPARSE,
        "steps where it is not 0",
        "last",
        ("health/format_drop", "running peak of the format rate's moving average minus its current value"),
        ("health/alerts", "health alerts this step raised (`health_alert` events)"),
    ),
    _g(
        "search totals",
        TOTAL,
        "`train_done`",
        "sum",
        ("search/<name>_total", "the run's total of `search/<name>` (`paid_calls`, `disk_hits`, `cost`)"),
        ("judge/<name>_total", "the run's total of `judge/<name>`"),
    ),
    _g(
        "search",
        CURVE,
        "every step",
        "per_call",
        Metric("search/calls", "searches asked", "sum"),
        ("search/success_rate", "share of valid searches that got an answer"),
        ("search/cache_hit_rate", "share of valid searches answered from memory (this run's, the disk cache's, or a query in flight)"),
        ("search/empty_rate", "share of valid searches answered with no result"),
        ("search/results_per_call", "results per answered search"),
        ("search/latency_p50", "median search latency, seconds (over calls that went to the backend)"),
        ("search/latency_p95", "95th percentile search latency, seconds"),
    ),
    _g(
        "search failures",
        SPARSE,
        "steps where it is not 0",
        "sum",
        ("search/errors", "searches that failed"),
        Metric("search/error_rate", "share of valid searches that failed", "per_call"),
        ("search/invalid_queries", "empty or unusable queries (not sent, not in the rates)"),
        ("search/truncated_queries", "queries cut to `[search] max_query_chars`"),
    ),
    _g(
        "search over HTTP",
        CURVE,
        "a search provider that sends HTTP requests",
        "sum",
        ("search/attempts", "HTTP requests sent (retries and key switches included)"),
        Metric("search/available", "1 while the provider can serve, 0 when every key is benched (the run stops, exit 3)", "min"),
    ),
    _g(
        "search HTTP failures",
        SPARSE,
        "a search provider that sends HTTP requests, steps where it is not 0",
        "sum",
        ("search/retries", "requests retried after a timeout, connection error or 5xx"),
        ("search/http_429", "answers 429 (rate limited)"),
        Metric("search/429_rate", "share of attempts answered 429", "per_call"),
        ("search/auth_errors", "answers 401/403 (the key was rejected)"),
        ("search/timeouts", "attempts that timed out"),
        Metric("search/timeout_rate", "share of attempts that timed out", "per_call"),
        ("search/connection_errors", "attempts that could not connect"),
        ("search/server_errors", "answers 5xx"),
        ("search/http_errors", "other HTTP error answers"),
        ("search/malformed_responses", "answers whose body could not be read"),
        ("search/api_errors", "API errors inside a 200 answer"),
        ("search/unavailable", "searches refused because every key was benched"),
        ("search/key_retries", "requests asked again with the next key after an unusable answer"),
    ),
    _g(
        "search spend",
        CURVE,
        "a keyed (billed) search service",
        "sum",
        ("search/paid_calls", "answers the service sent (what it bills)"),
        ("search/cache_hits", "searches answered from memory instead"),
        ("search/disk_hits", "searches answered from the disk cache of earlier runs"),
        ("search/cost", "`paid_calls` x `[search] cost_per_call` (set)"),
        ("search/keys_available", "keys not benched"),
        ("search/key_calls/<i>", "requests sent with key i (by index, never the key)"),
    ),
    _g(
        "judge",
        CURVE,
        "a reward with an LLM judge",
        "sum",
        ("judge/<name>", "the step's judge spend: `calls`, `cache_hits`, `disk_hits`, `failures`, `unparsed` (replies with no verdict), `tokens_in`, `tokens_out`, `cost` (with `price_in`/`price_out` set)"),
    ),
    _g(
        "held-out eval",
        CURVE,
        "`[train] eval_every` steps",
        "last",
        ("eval/heldout_em", "held-out exact match of the periodic eval (also its own `eval/heldout_em` event)"),
        ("eval/heldout_format_rate", "held-out share answered in the format"),
        ("eval/heldout_search_calls_mean", "held-out searches per question"),
        ("eval/heldout_em/<source>", "held-out exact match of each data source"),
    ),
    _g(
        "time and memory",
        CURVE,
        "every step",
        "max",
        ("time/rollout", "seconds of rollouts (sampling + search + reward)"),
        ("time/train", "seconds of the learner (forward/backward + optimizer step)"),
        ("time/step", "seconds of the whole step"),
        ("memory/peak_rss_gb", "this process's peak resident memory so far, GiB"),
    ),
    _g(
        "pipeline",
        MODE,
        "pipelined steps (`[train] max_staleness > 0`)",
        "last",
        ("staleness/mean", "mean of (policy version trained on - version that sampled) over the step's trajectories"),
        ("staleness/max", "the largest staleness of the step"),
        ("pipeline/trainer_idle_frac", "share of the step's window the trainer waited for rollouts"),
        ("pipeline/sampler_idle_frac", "share of the window the sampler waited"),
        ("pipeline/overlap_s", "seconds of rollouts that overlapped training"),
        mode="pipelined",
    ),
)  # fmt: skip


def _pattern(key: str) -> re.Pattern[str]:
    parts = re.split(r"<[a-z_]+>", key)
    return re.compile(".+".join(re.escape(p) for p in parts) + r"\Z")


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], MetricGroup, Metric], ...]:
    return tuple((_pattern(m.key), g, m) for g in SCHEMA for m in g.metrics)


@cache
def declared(key: str) -> tuple[MetricGroup, Metric] | None:
    """The group and row that declare ``key``, or None."""
    for pattern, group, metric in _patterns():
        if pattern.match(key):
            return group, metric
    return None


def assemble(
    values: Mapping[str, float], modes: Iterable[str] = ()
) -> tuple[dict[str, float], dict[str, float]]:
    """``(metrics event, run totals)`` of one step's ``values``: constants dropped, sparse
    diagnostics only when not 0, a ``mode`` group only in one of ``modes``, totals apart."""
    on = set(modes)
    event: dict[str, float] = {}
    totals: dict[str, float] = {}
    for key, value in values.items():
        found = declared(key)
        if found is None:
            event[key] = value
            continue
        group = found[0]
        if group.kind is Kind.TOTAL:
            totals[key] = value
        elif group.kind in (Kind.CONSTANT, Kind.DERIVED):
            continue
        elif group.kind is Kind.SPARSE and value == 0:
            continue
        elif group.mode is None or group.mode in on:
            event[key] = value
    return event, totals


def rule(key: str) -> Merge:
    """How ``key``'s values merge: its row's rule, else its group's; an undeclared key (a
    third-party learner's or plugin's) by its name: ``*_max`` max, ``*_min`` min, else sum."""
    found = declared(key)
    if found is None:
        return "max" if key.endswith("_max") else "min" if key.endswith("_min") else "sum"
    how = found[1].merge or found[0].merge
    if how == "scoped":
        head, _, rest = key.partition("/")
        return rule(f"{head}/{rest.partition('/')[2]}")
    return how


def merge(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One dict from several parts' numbers (a step's micro-batches, every rank's learner,
    search or judge numbers), each key by its declared :func:`rule`. A key a part lacks
    counts as 0 there for ``sum`` and ``mean`` and is skipped by ``min``, ``max`` and
    ``last``; ``per_call`` weighs each part by its ``<prefix>/calls``."""
    if len(parts) == 1:
        return {key: float(value) for key, value in parts[0].items()}
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        present = [float(p[key]) for p in parts if key in p]
        how = rule(key)
        if how == "per_call":
            calls_key = key.rsplit("/", 1)[0] + "/calls" if "/" in key else "calls"
            weighted = [(float(p.get(key, 0.0)), float(p.get(calls_key, 0.0))) for p in parts]
            total = sum(c for _, c in weighted)
            out[key] = sum(v * c for v, c in weighted) / total if total else weighted[0][0]
        elif how == "min":
            out[key] = min(present)
        elif how == "max":
            out[key] = max(present)
        elif how == "mean":
            out[key] = sum(present) / len(parts)
        elif how == "last":
            out[key] = present[-1]
        else:  # sum, recomputed
            out[key] = sum(present)
    return out
