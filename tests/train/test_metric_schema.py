"""The declared metric schema (:mod:`searchr1.core.metric_schema`): which of a step's numbers
the ``metrics`` event keeps, which go to ``train_done``, and how the ranks' numbers merge."""

from __future__ import annotations

import pytest

from searchr1.core.metric_schema import SCHEMA, Kind, assemble, declared, merge


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
