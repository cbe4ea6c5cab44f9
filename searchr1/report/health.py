"""The report's health section, shown at the top of the page: alerts (in red), the run notes
(turns cut at a token limit, steps that trained nothing: counted, not alarming), how many steps
trained no token, a table of the health and mismatch signals (first step, last step, range),
the held-out EM against the offline world's ceiling (untrusted evals marked), what the
importance ratio compares, and small charts of the signals.

Called by :func:`searchr1.report.page.render_page`. The numbers are those the train loop logs
(the health checks, :mod:`searchr1.core.health`, ``mismatch/*`` from the learner); a run logged before they
existed gets a short "not logged" note instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from searchr1.core.health import NOTICE_KINDS
from searchr1.core.step_metrics import logprob_diff_max
from searchr1.report.charts import ChartSpec, svg_chart
from searchr1.report.runlog import RunLog, is_number

#: the signals of the table, in this order (``health/searches/*`` follow)
ROWS = (
    ("health/response_tokens", "sampled tokens per response"),
    ("health/response_growth", "response length / first steps'"),
    ("health/format_rate", "format rate"),
    ("health/format_drop", "format-rate drop from its peak (moving average)"),
    ("health/repeat_ngram_rate", "repeated n-gram rate"),
    ("health/entropy", "entropy of sampled tokens (nats)"),
    ("displacement/delta", "rewarded responses' log-prob change per token"),
    ("displacement/fell_group_frac", "share of groups whose rewarded responses fell"),
    ("mismatch/k3", "sampler/learner KL (k3)"),
    ("mismatch/kl_sample_train", "mean sampler - learner log-prob"),
    ("mismatch/ratio_min", "smallest importance ratio"),
    ("mismatch/ratio_max", "largest importance ratio"),
)

CHARTS = (
    ChartSpec("health-entropy", "Entropy of sampled tokens", ("health/entropy",)),
    ChartSpec("health-format", "Format rate", ("health/format_rate",)),
    ChartSpec("health-length", "Sampled tokens per response", ("health/response_tokens",)),
    ChartSpec("health-repeat", "Repeated n-gram rate", ("health/repeat_ngram_rate",)),
    ChartSpec(
        "health-ratio", "Importance ratio range", ("mismatch/ratio_min", "mismatch/ratio_max")
    ),
)


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.4g}"


def _row(label: str, key: str, points: Sequence[tuple[float, float]]) -> str:
    values = [v for _, v in points]
    return (
        f'<tr><td class="text">{escape(label)}</td><td class="text"><code>{escape(key)}</code>'
        f"</td><td>{_fmt(values[0])}</td><td>{_fmt(values[-1])}</td>"
        f"<td>{_fmt(min(values))}</td><td>{_fmt(max(values))}</td></tr>"
    )


def _em_line(evals: Sequence[Mapping[str, Any]]) -> str:
    """``held-out EM: before X · cold_start Y · after Z · ceiling C`` from the train loop's
    eval events (the ceiling is the offline world's scripted ideal agent,
    :mod:`searchr1.plugins.offline_world.ideal_agent`)."""
    by_when: dict[str, float] = {}
    untrusted: set[str] = set()
    for e in evals:
        if str(e.get("event", "")) == "eval/heldout_em" and is_number(e.get("em")):
            when = str(e.get("when", ""))
            by_when[when] = float(e["em"])
            if e.get("trustworthy") is False:
                untrusted.add(when)
    if not by_when:
        return ""
    order = {"before": 0, "cold_start": 1, "after": 2, "ceiling": 3}
    whens = sorted(by_when, key=lambda w: order.get(w, 4))
    parts = [
        f"{escape(w)} <b>{100 * by_when[w]:.1f}%</b>"
        + (' <span class="warning">(untrusted: search failed)</span>' if w in untrusted else "")
        for w in whens
    ]
    notes = []
    if "ceiling" in by_when:
        notes.append(
            "ceiling: what the eval set's ideal agent scores (a scripted agent that searches "
            "exactly the right queries and copies the answer), the best EM this search allows"
        )
    if untrusted:
        notes.append(
            "untrusted: search success was under search.min_success_rate during that eval "
            "(the heldout_untrusted warning), so its EM says nothing of the model"
        )
    note = f'<br><span class="meta">{"; ".join(notes)}</span>' if notes else ""
    return f'<p id="health-em">held-out EM: {" · ".join(parts)}{note}</p>'


def _untrained_line(log: RunLog) -> str:
    """``K of N steps trained no token`` when some step's ``tokens/trained`` is 0: every group
    it kept was degenerate (all rewards equal), so its policy term changed nothing (a KL term,
    ``kl/mean`` logged, still trained). Counted from the metric series, so a resumed run's
    steps count too."""
    points = log.series.get("tokens/trained", [])
    idle = [int(step) for step, value in points if value == 0]
    if not idle:
        return ""
    shown = ", ".join(map(str, idle[:10])) + (", ..." if len(idle) > 10 else "")
    # A KL term trains every sampled token, degenerate groups' too.
    kl = "kl/mean" in log.series
    subject = "steps' policy term" if kl else "steps"
    anchor = "; the KL term alone moved their weights, toward the reference policy" if kl else ""
    return (
        f'<p class="warning" id="health-untrained">{len(idle)} of {len(points)} {subject} '
        f"trained no token (steps {shown}): every group they kept was degenerate (all its "
        f"rewards equal, every advantage 0){anchor}. See rollout.dynamic_sampling, "
        f"rollout.group_size and model.temperature</p>"
    )


def _diff_max_series(log: RunLog) -> list[tuple[float, float]]:
    """The largest |sampler - learner| log-prob per step: logged by older runs, else from the
    ratio extremes the step logs (:func:`~searchr1.core.step_metrics.logprob_diff_max`)."""
    if log.series.get("mismatch/logprob_diff_max"):
        return log.series["mismatch/logprob_diff_max"]
    highs = dict(log.series.get("mismatch/ratio_max", ()))
    points = []
    for step, low in log.series.get("mismatch/ratio_min", ()):
        if step in highs:
            value = logprob_diff_max({"mismatch/ratio_min": low, "mismatch/ratio_max": highs[step]})
            points.append((step, value))
    return points


def health_html(log: RunLog) -> str:
    """The whole health section (without its heading)."""
    # a run notice (turns cut at a token limit, a step that trained nothing) is counted over
    # the run and said once: a note, not a red alert of a failing policy
    alerts = [a for a in log.alerts if a.get("kind") not in NOTICE_KINDS]
    notices = [a for a in log.alerts if a.get("kind") in NOTICE_KINDS]

    def items(events: Sequence[Mapping[str, Any]]) -> str:
        return "".join(
            f"<li>step {escape(str(a.get('step', '?')))} · <b>{escape(str(a.get('kind', '')))}"
            f"</b>: {escape(str(a.get('message', '')))}</li>"
            for a in events
        )

    if alerts:
        alert_html = f'<ul class="warning" id="health-alerts">{items(alerts)}</ul>'
    else:
        alert_html = '<p id="health-alerts">no health alerts</p>'
    if notices:
        alert_html += (
            '<p class="meta">run notes (each said once, the run\'s count in train_done):</p>'
            f'<ul id="health-notices">{items(notices)}</ul>'
        )
    keys = [k for k, _ in ROWS] + sorted(k for k in log.series if k.startswith("health/searches/"))
    labels = dict(ROWS)
    rows = "".join(
        _row(labels.get(k, "searches per question · " + k.rsplit("/", 1)[-1]), k, log.series[k])
        for k in keys
        if log.series.get(k)
    )
    diff = _diff_max_series(log)
    if diff:
        rows += _row("max |sampler - learner| log-prob", "mismatch/logprob_diff_max", diff)
    if rows:
        table = (
            '<div class="scroll"><table id="health-table"><thead><tr><th class="text">signal'
            '</th><th class="text">metric</th><th>first step</th><th>last step</th><th>min</th>'
            f"<th>max</th></tr></thead><tbody>{rows}</tbody></table></div>"
        )
    else:
        table = '<p class="nodata">no health metrics in this run (logged by newer versions)</p>'
    basis = ""
    if log.ratio_basis:
        basis = f'<p class="meta" id="health-ratio-basis">{escape(log.ratio_basis)}</p>'
    charts = ""
    if rows:
        charts = '<div class="grid">' + "".join(svg_chart(c, log.series) for c in CHARTS) + "</div>"
    untrained = _untrained_line(log)
    return f"{alert_html}{untrained}{_em_line(log.evals)}{table}{basis}{charts}"
