"""The tables ``searchr1 eval`` prints: one per-source table per model, and one column per
model (base, then each checkpoint) to compare them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from searchr1.core.evaluation import EvalResult


def _pct(value: float) -> str:
    return "   -" if value is None or math.isnan(value) else f"{100 * value:5.1f}"


def format_table(result: EvalResult) -> str:
    """The per-source table ``searchr1 eval`` prints for one model."""
    m = result.metrics
    head = f"{'data_source':<16} {'n':>5} {'EM':>6} {'F1':>6} {'format':>6} {'search/q':>8} {'search ok':>9}"
    lines = [f"== {result.label}", head, "-" * len(head)]

    def row(name: str, g: Mapping[str, Any]) -> str:
        return (
            f"{name:<16} {g['n']:>5} {_pct(g['em']):>6} {_pct(g['f1']):>6} "
            f"{_pct(g['format_rate']):>6} {g['search_calls_mean']:>8.2f} "
            f"{_pct(g['search_success_rate']):>9}"
        )

    for source, g in m["per_source"].items():
        lines.append(row(source or "(none)", g))
    lines.append("-" * len(head))
    lines.append(row("micro (all)", m))
    lines.append(f"{'macro EM':<16} {'':>5} {_pct(m['macro_em']):>6}")
    lines.extend(trust_warning(result))
    return "\n".join(lines)


def trust_warning(result: EvalResult) -> list[str]:
    """A warning line when search failed too often for the scores to mean anything."""
    m = result.metrics
    if m["trustworthy"]:
        return []
    return [
        f"WARNING: {result.label}: search success {100 * m['search_success_rate']:.1f}% "
        f"< {100 * m['min_success_rate']:.0f}% ({m['search_errors']} of {m['search_calls']} "
        "searches failed): these scores are NOT trustworthy"
    ]


def format_comparison(results: Iterable[EvalResult]) -> str:
    """One column per evaluated model (``base``, ``step_20``, ...): EM per source, macro and
    micro EM, format rate and search success."""
    results = list(results)
    sources = sorted({s for r in results for s in r.metrics["per_source"]})
    width = max(10, *(len(r.label) for r in results))
    lines = [f"{'EM':<16}" + "".join(f" {r.label:>{width}}" for r in results)]
    lines.append("-" * len(lines[0]))
    for s in sources:
        cells = [r.metrics["per_source"].get(s, {}).get("em", float("nan")) for r in results]
        lines.append(f"{s or '(none)':<16}" + "".join(f" {_pct(c):>{width}}" for c in cells))
    lines.append("-" * len(lines[0]))
    for key, name in (
        ("macro_em", "macro EM"),
        ("micro_em", "micro EM"),
        ("f1", "F1"),
        ("format_rate", "format"),
        ("search_success_rate", "search ok"),
    ):
        lines.append(f"{name:<16}" + "".join(f" {_pct(r.metrics[key]):>{width}}" for r in results))
    return "\n".join(lines)
