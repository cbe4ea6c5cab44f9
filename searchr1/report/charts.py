"""The report's line charts, drawn by matplotlib: inline SVG for the page, PNG files for copies.

:data:`CHARTS` names the curves a person looks at first. :func:`draw` lays out one chart from
``(step, value)`` series (a chart's noisy headline curve faded under its moving average); :func:`svg_chart` saves it as the page's ``<figure>`` (inline SVG:
the page needs no script and no network to show it), :func:`write_pngs` as ``<slug>.png``
files (for slides, issues, chat). In the SVG each series is one ``<path class="series">``
plus a ``<use class="point">`` per point with a ``<title>`` tooltip (hover shows the step and
value).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.core.disk import atomic_write
from searchr1.core.metric_schema import Kind, declared

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: matplotlib's default palette: a series keeps its colour whichever keys of a chart are logged
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartSpec:
    """One chart: a slug (file and element id), a title and the metric names it plots."""

    slug: str
    title: str
    keys: tuple[str, ...]
    #: the key drawn on top, its points faded under a bold moving average (a noisy curve that
    #: others overlap, such as ``reward/mean`` over ``reward/correct``); "" for none
    smooth: str = ""


CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec(
        "reward", "Reward", ("reward/mean", "reward/format", "reward/correct"), smooth="reward/mean"
    ),
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

#: inches; 460.8 x 230.4 SVG user units, 640 x 320 PNG pixels
_SIZE = (6.4, 3.2)
#: past this many points a series gets small dots (they still carry the tooltip)
_DOTS_MAX = 60
# Fixed margins instead of tight_layout, which draws every chart twice (half the time).
_MARGINS = {"left": 0.11, "right": 0.98, "bottom": 0.15}
_RC = {"svg.fonttype": "none", "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"]}
#: no <metadata> element: it would carry the date (and namespace URLs)
_SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


def _present(spec: ChartSpec, series: Mapping[str, Series]) -> dict[str, list[tuple[float, float]]]:
    return {k: sorted(series[k]) for k in spec.keys if series.get(k)}


def draw(spec: ChartSpec, present: Mapping[str, Series], *, title: bool = True) -> Figure:
    """One chart of ``present``'s series (keys of ``spec``, at least one with a point); the
    line of ``present[spec.keys[i]]`` has the gid ``series-<i>``."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=_SIZE, dpi=100)
    fig.subplots_adjust(**_MARGINS, top=0.88 if title else 0.93)
    ax = fig.add_subplot()
    for key, points in present.items():
        i = spec.keys.index(key)
        xs, ys = [x for x, _ in points], [y for _, y in points]
        window = _window(len(points)) if key == spec.smooth else 0
        ax.plot(
            xs,
            ys,
            marker="o",
            markersize=3 if len(points) <= _DOTS_MAX else 1.5,
            color=PALETTE[i % len(PALETTE)],
            label=key,
            gid=f"series-{i}",
            alpha=0.4 if window else 1.0,
            zorder=3 if key == spec.smooth else 2,
        )
        if window:
            ax.plot(
                xs,
                moving_average(ys, window),
                color=PALETTE[i % len(PALETTE)],
                linewidth=2.5,
                label=f"{key}, mean of the last {window} steps",
                gid=f"smooth-{i}",
                zorder=4,
            )
    if title:
        ax.set_title(spec.title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _window(points: int) -> int:
    """Steps in the moving average of a curve of ``points`` points (0: too few to smooth)."""
    return 0 if points < 5 else max(3, min(10, points // 10))


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_pngs(out_dir: Path, series: Mapping[str, Series]) -> list[Path]:
    """One ``<slug>.png`` per chart of :data:`CHARTS` that has data; returns the files
    written."""
    import matplotlib

    written: list[Path] = []
    with matplotlib.rc_context(_RC):
        for spec in CHARTS:
            present = _present(spec, series)
            if not present:
                continue
            path = out_dir / f"{spec.slug}.png"
            with atomic_write(path, "wb") as fh:
                draw(spec, present).savefig(fh, format="png")
            written.append(path)
    return written


def svg_chart(spec: ChartSpec, series: Mapping[str, Series]) -> str:
    """The ``<figure>`` holding one chart (its title is the caption); series absent from
    ``series`` are listed as missing instead of drawn."""
    import matplotlib

    present = _present(spec, series)
    missing = [k for k in spec.keys if k not in present]
    caption = f"<figcaption>{escape(spec.title)}</figcaption>"
    if not present:
        return (
            f'<figure class="chart empty" id="chart-{spec.slug}">{caption}'
            f'<p class="nodata">no data ({escape(", ".join(spec.keys))} not logged)</p></figure>'
        )
    buf = io.StringIO()
    # The salt makes the clip-path and marker ids of each chart its own within the page.
    with matplotlib.rc_context({**_RC, "svg.hashsalt": spec.slug}):
        draw(spec, present, title=False).savefig(buf, format="svg", metadata=_SVG_METADATA)
    svg = _inline(buf.getvalue(), spec, present)
    return f'<figure class="chart" id="chart-{spec.slug}">{caption}{svg}{_missing_note(missing)}</figure>'


_ROOT = re.compile(r"<svg [^>]*>")
_USE = re.compile(r"<use ([^>]*)/>")
_ATTRIBUTE = re.compile(r'="[^"]*"')  # matplotlib's values: coordinates and styles, no label
_DIGITS = re.compile(r"(\.\d\d)\d+")
_GROUP_ID = re.compile(r'<g id="([^"]*)">')


def _inline(svg: str, spec: ChartSpec, present: Mapping[str, Series]) -> str:
    """matplotlib's SVG file as an element of the page: no XML prolog, a root that scales to
    the column, group ids unique within the page, and each series' path and points marked
    for the page's script and the reader's hover."""
    svg = svg[svg.index("<svg") :]
    svg = _ATTRIBUTE.sub(lambda m: _DIGITS.sub(r"\1", m[0]), svg)  # 0.01 unit is plenty
    svg = re.sub(r">\s+<", "><", svg)
    view_box = re.search(r'viewBox="([^"]*)"', svg)
    # The HTML parser puts xlink:href in the xlink namespace by itself, so the root
    # declares only the SVG namespace.
    root = (
        f'<svg class="plot" viewBox="{view_box[1] if view_box else "0 0 460.8 230.4"}" '
        f'role="img" aria-label="{escape(spec.title)}" xmlns="http://www.w3.org/2000/svg">'
    )
    svg = _ROOT.sub(lambda _: root, svg, count=1)
    for key, points in present.items():
        start = svg.index(f'<g id="series-{spec.keys.index(key)}">')
        # a line's group holds its path, its marker's <defs> and one <use> per point; the
        # next artist opens the next group with an id
        end = svg.find('<g id="', start + 1)
        end = len(svg) if end < 0 else end
        group = svg[start:end].replace(
            "<path ", f'<path class="series" data-key="{escape(key)}" ', 1
        )
        tips = iter(f"<title>{escape(key)} @ step {x:g}: {y:.4g}</title>" for x, y in points)
        group = _USE.sub(lambda m, t=tips: f'<use class="point" {m[1]}>{next(t, "")}</use>', group)
        svg = svg[:start] + group + svg[end:]
    # The other groups' ids (figure_1, axes_1, ...) repeat in every chart and name nothing.
    return _GROUP_ID.sub(
        lambda m: f'<g id="chart-{spec.slug}-{m[1]}">' if m[1].startswith("series-") else "<g>",
        svg,
    )


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
