"""The declared metric schema (:mod:`searchr1.core.metric_schema`): which of a step's numbers
the ``metrics`` event keeps, which go to ``train_done``, and how the ranks' numbers merge."""

from __future__ import annotations

from typing import get_args

import pytest

from searchr1.core.metric_schema import SCHEMA, Kind, Merge, assemble, declared, merge, rule
from searchr1.core.rewards import ComposedReward


def test_every_key_is_declared_once_and_each_group_says_when_it_is_logged() -> None:
    keys = [m.key for g in SCHEMA for m in g.metrics]
    assert len(keys) == len(set(keys))
    assert all(g.when and g.metrics for g in SCHEMA)
    assert all(g.mode for g in SCHEMA if g.kind is Kind.MODE)
    # a key matches the group that declares it, patterns included
    assert declared("health/searches/nq")[0].name == "health"
    assert declared("search/paid_calls_total")[0].kind is Kind.TOTAL
    assert declared("judge/calls")[0].name == "judge"
    assert declared("optim/lr")[0].kind is Kind.CONSTANT
    assert declared("optim/adapter_sync_s")[0].name == "update"
    assert declared("brand_new/metric") is None


def test_a_step_keeps_curves_drops_zero_diagnostics_and_sets_totals_apart() -> None:
    values = {
        "reward/mean": 0.0,  # a curve at 0 is still a point of the curve
        "search/errors": 0.0,  # a diagnostic at 0 is left out
        "search/http_429": 2.0,
        "end_reason/turn_limit": 0.0,
        "end_reason/answered": 1.0,
        "optim/lr": 1e-3,  # the config says it
        "mismatch/tokens": 40.0,  # tokens/trained says it
        "staleness/max": 0.0,
        "search/paid_calls_total": 7.0,
        "plugin/own_number": 3.0,  # a third-party plugin's key: passed on
    }
    event, totals = assemble(values)
    assert event == {
        "reward/mean": 0.0,
        "search/http_429": 2.0,
        "end_reason/answered": 1.0,
        "plugin/own_number": 3.0,
    }
    assert totals == {"search/paid_calls_total": 7.0}
    pipelined, _ = assemble(values, ("pipelined",))
    assert pipelined["staleness/max"] == 0.0  # in its mode, 0 is a value


def test_search_metrics_of_the_ranks_merge_as_one_provider_would_count() -> None:
    a = {
        "search/calls": 3.0,
        "search/errors": 1.0,
        "search/success_rate": 2 / 3,
        "search/latency_p50": 0.1,
        "search/available": 1.0,
    }
    b = {
        "search/calls": 1.0,  # no error: its sparse counter left out
        "search/success_rate": 1.0,
        "search/latency_p50": 0.5,
        "search/available": 0.0,
    }
    merged = merge([a, b])
    assert merged["search/calls"] == 4.0 and merged["search/errors"] == 1.0
    assert merged["search/success_rate"] == pytest.approx(3 / 4)  # 3 of the 4 calls answered
    assert merged["search/latency_p50"] == pytest.approx(0.2)  # weighted by calls
    assert merged["search/available"] == 0.0  # one rank's provider down: the job's is
    assert merge([a]) == a
    judge = merge([{"judge/calls": 2.0, "judge/calls_total": 5.0}, {"judge/calls": 1.0}])
    assert judge == {"judge/calls": 3.0, "judge/calls_total": 5.0}


def test_each_declared_merge_rule_combines_parts_that_way() -> None:
    """One key per rule of :data:`Merge`, merged from three parts (the middle one lacks it):
    the schema row's rule decides, whoever merges (micro-batches, ranks, calls)."""
    examples = {
        "sum": "search/errors",
        "mean": "reward/mean",
        "min": "search/available",
        "max": "kl_max",
        "last": "health/entropy",
        "per_call": "search/success_rate",
        "recomputed": "ratio_mean",
        "scoped": "mismatch/server1/ratio_max",
    }
    assert set(examples) == set(get_args(Merge))
    declared_rule = {
        how: (declared(key)[1].merge or declared(key)[0].merge) for how, key in examples.items()
    }
    assert declared_rule == {how: how for how in examples}
    parts = [
        {**{key: 4.0 for key in examples.values()}, "search/calls": 3.0},
        {"search/calls": 0.0},
        {**{key: 1.0 for key in examples.values()}, "search/calls": 1.0},
    ]
    merged = merge(parts)
    assert merged[examples["sum"]] == 5.0
    assert merged[examples["mean"]] == pytest.approx(5.0 / 3)  # a part without it counts 0
    assert merged[examples["min"]] == 1.0 and merged[examples["max"]] == 4.0
    assert merged[examples["last"]] == 1.0
    assert merged[examples["per_call"]] == pytest.approx((4.0 * 3 + 1.0 * 1) / 4)
    assert merged[examples["recomputed"]] == 5.0  # derived again after the merge
    assert rule("mismatch/server1/ratio_max") == "max"  # as mismatch/ratio_max
    assert rule("mismatch/server1/k3_sum") == "sum" and merged[examples["scoped"]] == 4.0
    # a key no row declares (a third-party learner's): by its name
    plugin = merge(
        [{"p/x_max": 2.0, "p/x_min": 2.0, "p/x": 2.0}, {"p/x_max": 3.0, "p/x_min": 1.0, "p/x": 1.0}]
    )
    assert plugin == {"p/x_max": 3.0, "p/x_min": 1.0, "p/x": 3.0}


def test_a_learner_s_micro_batches_merge_by_the_schema() -> None:
    """The learner sums the schema declares (``tokens``, ``ratio_sum``, ``kl_*``) merge as
    the step's means need them: sums add, extremes take the extreme."""
    a = {
        "tokens": 3.0,
        "ratio_sum": 3.3,
        "ratio_max": 1.2,
        "kl_sum": 0.3,
        "kl_tokens": 3.0,
        "kl_max": 0.2,
    }
    b = {
        "tokens": 1.0,
        "ratio_sum": 0.9,
        "ratio_max": 0.9,
        "kl_sum": 0.1,
        "kl_tokens": 1.0,
        "kl_max": 0.1,
    }
    merged = merge([a, b])
    assert merged == pytest.approx(
        {
            "tokens": 4.0,
            "ratio_sum": 4.2,
            "ratio_max": 1.2,
            "kl_sum": 0.4,
            "kl_tokens": 4.0,
            "kl_max": 0.2,
        }
    )
    assert all(declared(key)[0].kind is Kind.DERIVED for key in a)  # never logged raw


class _Spending:
    """A reward that reports spend (what the judge reward's ``metrics`` returns)."""

    def __init__(self, numbers: dict[str, float]) -> None:
        self.numbers = numbers

    def __call__(self, trajectory, golden_answers):  # noqa: ANN001, ANN204 - never scored here
        raise AssertionError("not scored")

    def metrics(self, reset: bool = False) -> dict[str, float]:
        return dict(self.numbers)


def test_a_composed_reward_merges_its_parts_spend_by_the_schema() -> None:
    base = _Spending({"judge/calls": 2.0, "judge/calls_total": 7.0, "reward/judge_fallbacks": 1.0})
    term = _Spending({"judge/calls": 3.0, "judge/calls_total": 4.0})
    composed = ComposedReward(base, (("second_judge", term), ("silent", lambda t, g: None)))
    assert composed.metrics() == {
        "judge/calls": 5.0,
        "judge/calls_total": 11.0,
        "reward/judge_fallbacks": 1.0,
    }
    assert ComposedReward(base, ()).metrics() == base.numbers  # one part: as it reported
