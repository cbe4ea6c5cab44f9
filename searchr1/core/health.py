"""The run's health checks, asked once per step (:class:`Health`): is the policy collapsing,
rambling, repeating itself, or drifting away from what the learner scores (:class:`HealthMonitor`,
settings in ``[train.health]``), and the run notices, conditions worth one warning per run
(:class:`RunNotices`). Their metrics join the step's ``metrics`` event, their alerts are logged
as ``health_alert`` warnings, their state is checkpointed (so a resumed run reports what the
uninterrupted one would have) and their counts go into ``train_done``. The report
(:mod:`searchr1.report.health`) shows the same metrics and alerts at the top of the page. The metrics and
alerts: docs/training.md, "Watching for collapse".
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.core.config_schema import Config, HealthSettings
from searchr1.core.step_metrics import displacement_metrics
from searchr1.core.token_limits import LimitHits, limit_hits
from searchr1.core.types import RewardResult, ScoredGroup, Trajectory


@dataclass(frozen=True)
class Alert:
    """A health warning, logged as ``health_alert``: a short ``kind`` and a sentence."""

    kind: str
    message: str


@dataclass(frozen=True)
class StepRecord:
    """One learned step, as the health checks see it."""

    step: int
    #: the groups the step trained on
    groups: Sequence[ScoredGroup]
    #: the step's first draw, the unbiased sample of the policy
    trajectories: Sequence[Trajectory]
    rewards: Sequence[RewardResult]
    #: the learner's merged metrics (``mismatch/*``, ``tokens``, ...)
    train_metrics: Mapping[str, float]
    #: the step's ``staleness/max``
    staleness: float


def repeated_ngram_rate(tokens: Sequence[int], n: int) -> tuple[int, int]:
    """``(repeated, total)`` n-grams of ``tokens``: an n-gram is repeated when the same n
    tokens already occurred at an earlier position."""
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    total = max(0, len(tokens) - n + 1)
    for i in range(total):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            repeated += 1
        seen.add(gram)
    return repeated, total


def sampled_tokens(trajectory: Trajectory) -> list[int]:
    """The tokens the policy sampled, in order (observations and prompt left out)."""
    return [t for t, g in zip(trajectory.tokens, trajectory.generated_mask, strict=True) if g]


def policy_metrics(trajectories: Sequence[Trajectory], ngram: int = 4) -> dict[str, float]:
    """The stateless ``health/*`` metrics of one step (see the module docstring)."""
    if not trajectories:
        return {}
    lengths = [sum(t.generated_mask) for t in trajectories]
    repeated = total = 0
    neg_logprob, sampled = 0.0, 0
    by_source: dict[str, list[int]] = defaultdict(list)
    for t in trajectories:
        r, n = repeated_ngram_rate(sampled_tokens(t), ngram)
        repeated, total = repeated + r, total + n
        for lp, g in zip(t.logprobs, t.generated_mask, strict=True):
            if g:
                neg_logprob -= lp
                sampled += 1
        by_source[t.data_source or "unknown"].append(t.search_calls)
    out = {
        "health/response_tokens": statistics.fmean(lengths),
        "health/repeat_ngram_rate": repeated / total if total else 0.0,
        "health/format_rate": statistics.fmean(float(t.format_ok) for t in trajectories),
    }
    if sampled:
        out["health/entropy"] = neg_logprob / sampled
    for source, calls in sorted(by_source.items()):
        out[f"health/searches/{source}"] = statistics.fmean(calls)
    out["health/follow_up_searches"] = statistics.fmean(
        max(0, t.search_calls - 1) for t in trajectories
    )
    return out


@dataclass
class HealthMonitor:
    """Run-long state of the health signals: the length baseline and the moving averages
    with their peaks. Saved in checkpoints (:meth:`state` / :meth:`load_state`) so that a
    resumed run reports what the uninterrupted one would have."""

    settings: HealthSettings = field(default_factory=HealthSettings)
    length_baseline: list[float] = field(default_factory=list)
    ema: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    alerted: dict[str, bool] = field(default_factory=dict)

    def observe(self, record: StepRecord) -> tuple[dict[str, float], list[Alert]]:
        """This step's ``health/*`` metrics and alerts (kinds ``format_cliff``,
        ``entropy_cliff``, ``search_cliff``, ``follow_up_cliff``, ``likelihood_displacement``,
        ``length_growth``, ``mismatch``); updates the run-long state.

        ``record.staleness`` (the step's ``staleness/max``): data sampled on older weights differs
        from the learner's by the updates since -- off-policy by design, corrected by the
        ratio, not a sampler/learner drift -- so the mismatch alert is only raised on steps
        sampled on the weights they train (staleness 0)."""
        s = self.settings
        metrics = policy_metrics(record.trajectories, s.ngram)
        alerts: list[Alert] = []
        if "health/response_tokens" in metrics:
            length = metrics["health/response_tokens"]
            if len(self.length_baseline) < s.baseline_steps:
                self.length_baseline.append(length)
            base = statistics.fmean(self.length_baseline)
            growth = length / base if base > 0 else 1.0
            metrics["health/response_growth"] = growth
            if s.max_length_growth and growth > s.max_length_growth:
                alerts.append(
                    Alert(
                        "length_growth",
                        f"responses average {length:.0f} sampled tokens, {growth:.1f}x the "
                        f"first steps' {base:.0f} (train.health.max_length_growth = "
                        f"{s.max_length_growth:g})",
                    )
                )
        signals = dict(metrics)
        if record.trajectories:  # every source's searches per question, for the search cliff
            signals["searches"] = statistics.fmean(t.search_calls for t in record.trajectories)
        alerts.extend(self.cliff_alerts(signals))
        if "health/format_rate" in signals:
            key = "health/format_rate"
            metrics["health/format_drop"] = self.peak[key] - self.ema[key]
        if (alert := self._displacement(record.train_metrics)) is not None:
            alerts.append(alert)
        if record.staleness == 0:
            alerts.extend(mismatch_alerts(record.train_metrics, s))
        metrics["health/alerts"] = float(len(alerts))
        return metrics, alerts

    def _average(self, key: str, value: float) -> float:
        """The moving average of ``key`` with ``value`` added."""
        s = self.settings
        ema = value if key not in self.ema else s.ema * value + (1 - s.ema) * self.ema[key]
        self.ema[key] = ema
        return ema

    def _displacement(self, train_metrics: Mapping[str, float]) -> Alert | None:
        """Update the moving averages of the step's likelihood displacement (none: a trainer
        that does not measure it, or a step without positive responses); an alert the first
        time they say the update pushes the rewarded responses down (again only after it
        recovered)."""
        d = displacement_metrics(train_metrics)
        if not d:
            return None
        s = self.settings
        delta = self._average("displacement/delta", d["displacement/delta"])
        share = self._average("displacement/fell_group_frac", d["displacement/fell_group_frac"])
        fell = delta < 0 and share > s.displacement_warn_share
        first = fell and not self.alerted.get("displacement", False)
        self.alerted["displacement"] = fell
        if not first:
            return None
        return Alert(
            "likelihood_displacement",
            f"the updates lower the likelihood of the responses they reward (lazy likelihood "
            f"displacement, which precedes GRPO collapse in search agents): moving averages "
            f"{share:.0%} of groups fell (train.health.displacement_warn_share = "
            f"{s.displacement_warn_share:g}), {delta:+.3g} nats per token (this step "
            f"{d['displacement/logprob_before']:.3g} -> {d['displacement/logprob_after']:.3g}). "
            f"Remedies: a lower [optimizer] lr; [model.local] llds_coef = 0.1 (the LLDS "
            f"regularizer, docs/training.md); [train.loss] kl_coef > 0; "
            f'[train.health] on_alert = "stop" to keep the checkpoint before it collapses',
        )

    def cliff_alerts(self, signals: Mapping[str, float]) -> list[Alert]:
        """Update the moving average of each :data:`CLIFFS` signal in ``signals``; an alert
        the first time one falls below ``cliff_fraction`` of its running peak, a peak above
        its floor (again only after it recovered). A policy that stopped searching at all has
        lost its follow-ups too: the search cliff says so, with the remedies for that, and the
        follow-up cliff keeps quiet."""
        alerts: list[Alert] = []
        for c in CLIFFS:
            if c.key in signals and (alert := self._cliff(c, signals[c.key])) is not None:
                if not (c.key == "health/follow_up_searches" and self.alerted.get("searches")):
                    alerts.append(alert)
        return alerts

    def _cliff(self, c: Cliff, value: float) -> Alert | None:
        s = self.settings
        ema = self._average(c.key, value)
        peak = max(self.peak.get(c.key, ema), ema)
        self.peak[c.key] = peak
        fell = peak > c.floor and ema < s.cliff_fraction * peak
        first = fell and not self.alerted.get(c.key, False)
        self.alerted[c.key] = fell
        if not first:
            return None
        return Alert(
            c.kind,
            f"{c.what} fell off a cliff: moving average {ema:.3g}, under "
            f"{s.cliff_fraction:.0%} of its peak {peak:.3g} (this step {value:.3g}). {c.remedy}",
        )

    def state(self) -> dict[str, Any]:
        return {
            "length_baseline": list(self.length_baseline),
            "ema": dict(self.ema),
            "peak": dict(self.peak),
            "alerted": dict(self.alerted),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.length_baseline = [float(x) for x in state.get("length_baseline", [])]
        self.ema = {str(k): float(v) for k, v in state.get("ema", {}).items()}
        self.peak = {str(k): float(v) for k, v in state.get("peak", {}).items()}
        self.alerted = {str(k): bool(v) for k, v in state.get("alerted", {}).items()}


@dataclass(frozen=True)
class Cliff:
    """A signal whose fall off a cliff is an alert."""

    #: the key in the step's signals (``searches``: every trajectory's searches per question,
    #: not logged as such: the step's ``searches_per_trajectory``)
    key: str
    #: the alert's kind
    kind: str
    #: what the signal is, in the alert's message
    what: str
    #: the remedies the message names
    remedy: str
    #: the peak its moving average must have reached for a fall to be a collapse (below it a
    #: fall is a few searches' noise)
    floor: float = 0.0


#: the signals whose fall off a cliff is an alert, in the order they are checked
CLIFFS: tuple[Cliff, ...] = (
    Cliff(
        "health/format_rate",
        "format_cliff",
        "format rate",
        "Look at the trajectory dumps for what the answers became; a lower [optimizer] lr, "
        "or a larger [reward.<name>] format_penalty",
    ),
    Cliff(
        "health/entropy",
        "entropy_cliff",
        "sampled-token entropy",
        "An entropy collapse: the policy stops exploring and groups turn degenerate. "
        'Remedies: a lower [optimizer] lr; [train.loss] kl_coef > 0; loss_fn = "ppo" with '
        "a higher [train.loss] clip_high (clip-higher keeps rare tokens alive); a higher "
        "[model] temperature",
    ),
    Cliff(
        "searches",
        "search_cliff",
        "searches per question",
        "The policy stopped searching and guesses (under-searching). Check search/"
        "success_rate first (a broken search teaches it not to search); remedies: "
        '[reward] terms = ["retrieval_credit"] (credit for retrieving the answer), a lower '
        "[reward.search_cost] cost_per_search if that term is on, a lower [optimizer] lr",
        floor=0.5,  # a policy that searched on every other question
    ),
    Cliff(
        # A multi-hop policy that stops at its first search keeps searching once a question,
        # so the searches per question fall by half at most and never under the cliff; the
        # searches after the first fall to 0 (docs/benchmarks.md, "The harder world").
        "health/follow_up_searches",
        "follow_up_cliff",
        "follow-up searches per question (searches after the first)",
        "The policy answers after its first search (multi-hop under-searching); "
        "health/searches/<data_source> shows which questions lost their second search. "
        'Remedies: [reward] terms = ["retrieval_credit"] (credit for retrieving the answer); '
        "[reward.search_cost] only_when_correct = true or a lower cost_per_search if that term "
        "is on; [train.loss] kl_coef > 0; a lower [optimizer] lr",
        floor=0.3,  # one that searched again on about one question in three
    ),
)


def mismatch_alerts(metrics: Mapping[str, float], s: HealthSettings) -> list[Alert]:
    """An alert when the step's sampler/learner mismatch passes the thresholds (none when
    the provider reports no ``mismatch/*`` metrics)."""
    k3 = metrics.get("mismatch/k3")
    low, high = metrics.get("mismatch/ratio_min"), metrics.get("mismatch/ratio_max")
    if k3 is None or low is None or high is None:
        return []
    if (
        k3 <= s.mismatch_warn_k3
        and 1 / s.mismatch_warn_ratio <= low
        and high <= s.mismatch_warn_ratio
    ):
        return []
    return [
        Alert(
            "mismatch",
            f"the learner does not score what the sampler sampled: k3 {k3:.3g} "
            f"(train.health.mismatch_warn_k3 = {s.mismatch_warn_k3:g}), ratio in "
            f"[{low:.3g}, {high:.3g}] (warn outside x{s.mismatch_warn_ratio:g}), max |log-prob "
            f"diff| {metrics.get('mismatch/logprob_diff_max', float('nan')):.3g}. Usual causes: "
            f"bf16, a different sampling engine, temperature. Consider [train.loss] ratio_cap",
        )
    ]


def degenerate_advice(cfg: Config, groups: Sequence[ScoredGroup], hits: LimitHits) -> str:
    """What to change when every group of a step was degenerate, by its cause. A reward that
    cannot vary (no answer in the protocol's format: every sample gets the same penalty) and
    questions every sample answers right are not helped by more samples; questions none
    answers right may be (after search is checked), as are groups that merely agreed."""
    sampling = (
        "raise rollout.max_extra_draws (dynamic sampling draws fresh questions for degenerate "
        "groups)"
        if cfg.rollout.dynamic_sampling
        else "set rollout.dynamic_sampling = true (fresh questions replace degenerate groups)"
    )
    sampling += ", or raise rollout.group_size or model.temperature"
    trajectories = [t for g in groups for t in g.trajectories]
    if not any(t.format_ok for t in trajectories):
        cause = (
            "No trajectory answered in the protocol's format, so the reward could not vary: "
            "more samples would get the same penalty. "
        )
        if hits.turns_cut:
            return cause + (
                f"Raise model.max_new_tokens (= {cfg.model.max_new_tokens}): turns ended at it "
                f"before their closing tag"
            )
        return cause + (
            "Teach the model the protocol first ([train.cold_start] steps), or check that "
            "rollout.protocol fits its chat template"
        )
    rewards = [r for g in groups for r in g.rewards]
    correct = [r.components["correct"] for r in rewards if "correct" in r.components]
    if correct and len(correct) == len(rewards):  # a reward that says what was right
        if all(c >= 1.0 for c in correct):
            return (
                "Every trajectory answered right: the questions are too easy for the model, "
                "and more samples would agree too. Train on harder questions ([data] train)"
            )
        if all(c <= 0.0 for c in correct):
            return (
                "No trajectory answered right: check that search works (search/success_rate) "
                "and that the corpus answers the questions; then " + sampling
            )
    return sampling[0].upper() + sampling[1:]


#: the kinds of :class:`RunNotices`: a condition counted over the run, not a failing policy
NOTICE_KINDS = frozenset({"no_tokens_trained", "max_new_tokens", "max_trajectory_tokens"})


@dataclass
class RunNotices:
    """Once-per-run warnings: ``no_tokens_trained`` (every kept group degenerate, so the
    policy term trained nothing; a KL term still did), ``max_new_tokens`` and
    ``max_trajectory_tokens`` (:mod:`searchr1.core.token_limits`), each raised the first step
    it happens and counted."""

    config: Config
    counts: dict[str, int] = field(default_factory=dict)
    raised: set[str] = field(default_factory=set)

    def observe(self, record: StepRecord) -> list[Alert]:
        """This step's notices."""
        cfg, step, groups = self.config, record.step, record.groups
        out: list[Alert] = []
        hits = limit_hits(
            record.trajectories,
            max_new_tokens=cfg.model.max_new_tokens,
            max_trajectory_tokens=cfg.rollout.max_trajectory_tokens,
        )
        if groups and all(g.degenerate for g in groups):
            # With a KL term the degenerate groups' tokens still train (toward the reference).
            kl_tokens = int(record.train_metrics.get("kl_tokens", 0))
            subject = f"step {step}'s policy term" if kl_tokens else f"step {step}"
            effect = (
                f"only the KL term ([train.loss] kl_coef, {kl_tokens} tokens) moved the "
                f"weights, toward the reference policy"
                if kl_tokens
                else "the update changed nothing"
            )
            out += self._count(
                "no_tokens_trained",
                1,
                f"{subject} trained no token: all {len(groups)} of its groups were degenerate "
                f"(every trajectory of a group got the same reward, so "
                f"every advantage is 0) and {effect}. {degenerate_advice(cfg, groups, hits)}",
            )
        sentences = iter(hits.sentences())
        if hits.turns_cut:
            out += self._count("max_new_tokens", hits.turns_cut, f"step {step}: {next(sentences)}")
        if hits.trajectories_cut:
            out += self._count(
                "max_trajectory_tokens", hits.trajectories_cut, f"step {step}: {next(sentences)}"
            )
        return out

    def _count(self, kind: str, n: int, message: str) -> list[Alert]:
        self.counts[kind] = self.counts.get(kind, 0) + n
        if kind in self.raised:
            return []
        self.raised.add(kind)
        return [Alert(kind, f"{message} (warned once per run; the total is in train_done)")]

    def state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "raised": sorted(self.raised)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
        self.raised = {str(k) for k in state.get("raised", [])}

    def totals(self) -> dict[str, int]:
        """The run's counts (only those that happened), for ``train_done``."""
        names = {
            "no_tokens_trained": "steps_without_training",
            "max_new_tokens": "turns_cut_at_max_new_tokens",
            "max_trajectory_tokens": "trajectories_cut_at_max_trajectory_tokens",
        }
        return {names[k]: v for k, v in self.counts.items()}


@dataclass
class Health:
    """The health checks and run notices of one ``train`` run, called once per step."""

    monitor: HealthMonitor
    notices: RunNotices
    #: the health alert that ends the run (``on_alert = "stop"``); None while none did
    stop_alert: Alert | None = None

    @classmethod
    def for_config(cls, config: Config) -> Health:
        """``[train.health]``'s checks."""
        from searchr1.core.config_validate import plugin_settings

        settings = plugin_settings(config, "train", "health", HealthSettings)
        return cls(HealthMonitor(settings), RunNotices(config))

    def observe(self, record: StepRecord) -> tuple[dict[str, float], list[Alert]]:
        """The step's ``health/*`` metrics and every alert (health checks first)."""
        metrics, alerts = self.monitor.observe(record)
        if alerts and self.monitor.settings.on_alert == "stop" and self.stop_alert is None:
            self.stop_alert = alerts[0]
        return metrics, alerts + self.notices.observe(record)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (under ``health`` and ``run_notices``)."""
        return {"health": self.monitor.state(), "run_notices": self.notices.state()}

    def load_state(self, saved: Mapping[str, Any]) -> None:
        self.monitor.load_state(saved.get("health") or {})
        self.notices.load_state(saved.get("run_notices") or {})
