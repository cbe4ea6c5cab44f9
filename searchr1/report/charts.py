"""Line charts as inline SVG: the report page draws itself with no script and no network.

:data:`CHARTS` names the curves a person looks at first (the same list feeds the PNGs in
:mod:`searchr1.report.pngs`); :func:`svg_chart` draws one chart from ``(step, value)``
series. Each series is one ``<path class="series">`` plus a ``<circle>`` per point with a
``<title>`` tooltip (hover shows the step and value).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from searchr1.core.metric_schema import Kind, declared

#: matplotlib's default palette, so the PNGs and the page agree
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartSpec:
    """One chart: a slug (file and element id), a title and the metric names it plots."""

    slug: str
    title: str
    keys: tuple[str, ...]


CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("reward", "Reward", ("reward/mean", "reward/format", "reward/correct")),
    ChartSpec(
        "search", "Search success / error rate", ("search/success_rate", "search/error_rate")
    ),
    ChartSpec("degenerate", "Degenerate group rate", ("degenerate_group_rate",)),
    ChartSpec("searches", "Searches per trajectory", ("searches_per_trajectory",)),
    ChartSpec(
        "tokens",
        "Tokens per trajectory (all / sampled)",
        ("tokens/trajectory_mean", "health/response_tokens"),
    ),
    ChartSpec("step_time", "Step time (s)", ("time/step",)),
)

Series = Sequence[tuple[float, float]]

# Geometry of one chart, in SVG user units (the page scales it to its column width).
_W, _H = 480, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 28, 34


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """About ``count`` round tick values (1, 2, 2.5 or 5 times a power of ten) covering
    [lo, hi]; ``integer`` ticks (steps) are whole numbers."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    multiples = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * power for m in multiples if m * power >= raw)
    if integer:
        step = max(1.0, step)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10_000:
        return f"{value / 1000:.0f}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _bounds(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:  # a flat line: give it some room instead of dividing by zero
        pad = abs(lo) * 0.1 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def svg_chart(spec: ChartSpec, series: Mapping[str, Series]) -> str:
    """The ``<figure>`` holding one chart; series absent from ``series`` are listed as
    missing instead of drawn."""
    present = {k: sorted(series[k]) for k in spec.keys if series.get(k)}
    missing = [k for k in spec.keys if k not in present]
    caption = f"<figcaption>{escape(spec.title)}</figcaption>"
    if not present:
        return (
            f'<figure class="chart empty" id="chart-{spec.slug}">{caption}'
            f'<p class="nodata">no data ({escape(", ".join(spec.keys))} not logged)</p></figure>'
        )
    xs = [x for pts in present.values() for x, _ in pts]
    ys = [y for pts in present.values() for _, y in pts]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo, y_hi = _bounds(ys)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return _TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = [
        f'<svg class="plot" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{escape(spec.title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    for tick in nice_ticks(y_lo, y_hi):
        y = py(tick)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>'
        )
    for tick in nice_ticks(x_lo, x_hi, 8, integer=True):
        x = px(tick)
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">'
            f"{_fmt(tick)}</text>"
        )
    parts.append(
        f'<text class="axis" x="{_LEFT + plot_w / 2:.0f}" y="{_H - 4}" text-anchor="middle">step</text>'
    )
    legend_x = _LEFT
    for i, (key, points) in enumerate(present.items()):
        color = PALETTE[spec.keys.index(key) % len(PALETTE)]
        d = " ".join(
            f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y) in enumerate(points)
        )
        parts.append(
            f'<path class="series" data-key="{escape(key)}" d="{d}" stroke="{color}" fill="none"/>'
        )
        # Dots only while they stay readable; the tooltip carries the exact number.
        radius = 2.5 if len(points) <= 60 else 1.2
        for x, y in points:
            parts.append(
                f'<circle class="point" cx="{px(x):.1f}" cy="{py(y):.1f}" r="{radius}" '
                f'fill="{color}"><title>{escape(key)} @ step {_fmt(x)}: {y:.4g}</title></circle>'
            )
        parts.append(
            f'<rect x="{legend_x}" y="8" width="10" height="10" fill="{color}"/>'
            f'<text class="legend" x="{legend_x + 14}" y="17">{escape(key)}</text>'
        )
        legend_x += 22 + 7 * len(key)
        del i
    parts.append("</svg>")
    note = _missing_note(missing)
    return f'<figure class="chart" id="chart-{spec.slug}">{caption}{"".join(parts)}{note}</figure>'


def _missing_note(missing: Sequence[str]) -> str:
    """What a chart says of its keys without a point: a sparse diagnostic is logged only on
    steps where it is not 0 (:mod:`searchr1.core.metric_schema`), so it was 0 throughout."""
    if not missing:
        return ""

    def sparse(key: str) -> bool:
        found = declared(key)
        return found is not None and found[0].kind is Kind.SPARSE

    zero = [k for k in missing if sparse(k)]
    absent = [k for k in missing if not sparse(k)]
    bits = ([f"not logged: {', '.join(absent)}"] if absent else []) + (
        [f"0 on every step: {', '.join(zero)}"] if zero else []
    )
    return f'<p class="nodata">{escape("; ".join(bits))}</p>'
