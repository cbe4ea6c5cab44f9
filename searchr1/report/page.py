"""The report's HTML: one self-contained file (inline CSS, inline SVG, a few lines of inline
script), readable offline and safe to mail around.

Called by :func:`searchr1.report.build_report` with a loaded :class:`RunLog`. Every text that
comes from the run (questions, model output, observations) is HTML-escaped: a model can
write ``<script>`` too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from searchr1.report.charts import CHARTS, ChartSpec, svg_chart
from searchr1.report.health import CHARTS as HEALTH_CHARTS
from searchr1.report.health import health_html
from searchr1.report.runlog import RunLog, is_number

#: eval-table columns shown first, in this order, when present
_EVAL_FIRST = (
    "n",
    "em",
    "macro_em",
    "micro_em",
    "heldout_em",
    "f1",
    "format_rate",
    "search_success_rate",
    "search_calls_mean",
    "reward_mean",
)
_EVAL_SKIP = frozenset(
    {"event", "timestamp", "level", "run_id", "logger", "min_success_rate", "seconds"}
)
_PERCENT_RE = re.compile(r"(^|[/_])(em|f1|rate)$|^em/")
#: at most this many extra metric charts (beyond :data:`CHARTS`)
_MAX_EXTRA_CHARTS = 80

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:16px 24px;color:#222;background:#fff}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555}.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
figure.chart{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:8px}
figcaption{font-weight:600;margin-bottom:4px}svg.plot{width:100%;height:auto}
.nodata{color:#888;font-size:12px;margin:4px 0}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f5f5f5}td.text,th.text{text-align:left}tr.warn td{background:#fff1f0}
details{margin:4px 0}summary{cursor:pointer}details.step>summary{font-weight:600}
details.trajectory{border-left:3px solid #ccc;padding-left:8px;margin-left:8px}
details.trajectory.good{border-color:#2ca02c}details.trajectory.bad{border-color:#d62728}
.turn{margin:6px 0 6px 8px}.badge{display:inline-block;font-size:11px;padding:0 6px;border-radius:8px;
background:#eee;margin-right:4px}.badge.search{background:#e3f0fb}.badge.answer{background:#e5f5e5}
.badge.invalid,.badge.error{background:#fde2e1}pre{white-space:pre-wrap;word-break:break-word;
background:#f8f8f8;padding:6px;margin:2px 0;font-size:12px;max-height:320px;overflow:auto}
.warning{color:#a8071a;font-weight:600}.scroll{overflow-x:auto;max-width:100%}
"""

# Deep links: opening report.html#traj-... expands the trajectory and every parent <details>.
# The second part records each curve's drawn length, so a headless browser test can check
# that the browser laid the charts out.
_JS = """
function openTarget(){var id=decodeURIComponent(location.hash.slice(1));if(!id)return;
var el=document.getElementById(id);for(var n=el;n;n=n.parentElement){if(n.tagName==='DETAILS')n.open=true;}
if(el)el.scrollIntoView();}
window.addEventListener('hashchange',openTarget);
document.addEventListener('DOMContentLoaded',function(){openTarget();
document.querySelectorAll('svg path.series').forEach(function(p){
p.setAttribute('data-drawn-length',p.getTotalLength().toFixed(1));});});
"""


def _num(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if not is_number(value):
        return escape(str(value)) if value is not None else ""
    if _PERCENT_RE.search(key) and 0 <= value <= 1:
        return f"{100 * value:.1f}%"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def _eval_table(evals: Sequence[Mapping[str, Any]]) -> str:
    if not evals:
        return '<p class="nodata" id="evals-empty">no eval results in this run</p>'
    text_cols = ["event", "label", "when", "data", "checkpoint"]
    text_cols = [c for c in text_cols if any(c in e for e in evals)]
    has_step = any("step" in e for e in evals)
    keys = _eval_keys(evals)
    head = "".join(f'<th class="text">{escape(c)}</th>' for c in text_cols)
    head += "<th>step</th>" if has_step else ""
    head += "".join(f"<th>{escape(k)}</th>" for k in keys)
    rows = []
    for e in evals:
        cls = ' class="warn"' if e.get("trustworthy") is False else ""
        cells = "".join(
            f'<td class="text">{escape(str(e[c]) if e.get(c) is not None else "")}</td>'
            for c in text_cols
        )
        cells += f"<td>{_num('step', e.get('step', ''))}</td>" if has_step else ""
        cells += "".join(f"<td>{_num(k, e.get(k))}</td>" for k in keys)
        rows.append(f"<tr{cls}>{cells}</tr>")
    warn = ""
    if any(e.get("trustworthy") is False for e in evals):
        warn = (
            '<p class="warning">Rows in red had search success under the configured minimum: '
            "their scores are not trustworthy.</p>"
        )
    return (
        f'<div class="scroll"><table id="evals"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>{warn}"
    )


def _eval_keys(evals: Sequence[Mapping[str, Any]]) -> list[str]:
    """The number columns of the eval table: :data:`_EVAL_FIRST` first, EM per data source
    right after the EM (a wide table scrolls: they must not be last), then any other number
    or flag the rows carry (other per-source splits and :data:`_EVAL_SKIP` left out)."""
    keys: list[str] = [k for k in _EVAL_FIRST if any(is_number(e.get(k)) for e in evals)]
    sources = sorted({k for e in evals for k in e if k.startswith("em/") and is_number(e[k])})
    if sources:
        at = keys.index("em") + 1 if "em" in keys else len(keys)
        keys[at:at] = sources

    def shown(k: str, v: Any) -> bool:
        if k in keys or k in _EVAL_SKIP or k == "step":
            return False
        return (is_number(v) or isinstance(v, bool)) and ("/" not in k or k.startswith("em/"))

    keys += dict.fromkeys(k for e in evals for k, v in e.items() if shown(k, v))
    return keys


def _turn_html(turn: Mapping[str, Any], index: int) -> str:
    action = str(turn.get("action") or "none")
    parts = [
        f'<div class="turn"><span class="badge {escape(action)}">turn {index} · {escape(action)}</span>'
    ]
    if turn.get("query"):
        parts.append(f'<span class="query">query: <b>{escape(str(turn["query"]))}</b></span>')
    if turn.get("search_error"):
        parts.append(
            f'<span class="badge error">search error: {escape(str(turn["search_error"]))}</span>'
        )
    parts.append(f'<pre class="turn-text">{escape(str(turn.get("text", "")))}</pre>')
    if turn.get("observation_text"):
        parts.append(f'<pre class="observation">{escape(str(turn["observation_text"]))}</pre>')
    parts.append("</div>")
    return "".join(parts)


def _trajectory_html(traj: Mapping[str, Any], anchor: str) -> str:
    reward = traj.get("reward")
    em = traj.get("em")
    good = (em == 1) if em is not None else (is_number(reward) and reward > 0)
    cls = "good" if good else "bad"
    answer = traj.get("final_answer")
    summary = (
        f'<span class="badge">{"reward " + _num("reward", reward) if reward is not None else "no reward"}</span>'
        f"{escape(str(traj.get('question', '?')))} → <b>{escape(str(answer)) if answer is not None else '<i>no answer</i>'}</b>"
        f' <span class="meta">({escape(str(traj.get("end_reason", "")))})</span>'
    )
    golden = ", ".join(str(g) for g in traj.get("golden_answers") or [])
    facts = [f"<div>golden answers: <b>{escape(golden)}</b></div>"]
    if traj.get("data_source"):
        facts.append(f"<div>data source: {escape(str(traj['data_source']))}</div>")
    components = traj.get("components") or {}
    if components:
        comp = ", ".join(f"{escape(str(k))}={_num(str(k), v)}" for k, v in components.items())
        facts.append(f"<div>reward components: {comp}</div>")
    if em is not None:
        facts.append(f"<div>EM {_num('em', em)} · F1 {_num('f1', traj.get('f1'))}</div>")
    final = f"<b>{escape(str(answer))}</b>" if answer is not None else "<i>no answer</i>"
    turns = "".join(_turn_html(t, i) for i, t in enumerate(traj.get("turns") or [], start=1))
    return (
        f'<details class="trajectory {cls}" id="{escape(anchor)}"><summary>{summary}</summary>'
        f"{''.join(facts)}{turns}<div>final answer: {final}</div></details>"
    )


def _group_html(
    title: str, anchor: str, trajs: Sequence[Mapping[str, Any]], step_mean: float | None = None
) -> str:
    """The dumped trajectories of one step (or one eval): their own mean reward, and the
    step's ``reward/mean`` over all its trajectories when known (a few dumped ones are not
    the step)."""
    rewards = [t["reward"] for t in trajs if is_number(t.get("reward"))]
    mean = f" · their mean reward {sum(rewards) / len(rewards):.3f}" if rewards else ""
    if step_mean is not None:
        mean += f" (the step's reward/mean over all its trajectories: {step_mean:.3f})"
    body = "".join(_trajectory_html(t, f"{anchor}-{i}") for i, t in enumerate(trajs))
    return (
        f'<details class="step" id="{escape(anchor)}"><summary>{escape(title)} · '
        f"{len(trajs)} trajectories{mean}</summary>{body}</details>"
    )


def _spend_html(log: RunLog) -> str:
    """What the run paid its search service: every logged step summed (a step done again
    after a resume paid again, so it counts again)."""

    def total(key: str) -> float:
        return sum(v for _, v in log.series.get(key, ()))

    paid, disk = total("search/paid_calls"), total("search/disk_hits")
    if not (paid or disk):
        return ""  # no paid search service in this run
    hits = total("search/cache_hits")
    bits = [
        f"paid calls <b>{int(paid)}</b>",
        f"answered from the cache {int(round(hits))} (kept on disk by earlier runs: {int(disk)})",
    ]
    if "search/cost" in log.series:
        bits.append(f"cost <b>{total('search/cost'):.4g}</b>")
    keys = sorted(
        (int(k.rsplit("/", 1)[1]), total(k))
        for k in log.series
        if re.fullmatch(r"search/key_calls/\d+", k)
    )
    if keys:
        bits.append("calls per key " + ", ".join(f"#{i}: {int(n)}" for i, n in keys))
    return f'<h2 id="spend">Search spend</h2>\n<p id="search-spend">{" · ".join(bits)}</p>'


def _judge_html(log: RunLog) -> str:
    """What the reward's LLM judge cost (the run totals of the last ``train_done``, else every
    logged step summed), its failures (every ``judge_failures`` event) and how often it
    agreed with exact match (``docs/rewards.md``); empty for a run without a judge."""

    def total(key: str) -> float:
        return sum(v for _, v in log.series.get(key, ()))

    if "judge/calls" not in log.series and not log.judge_failures:
        return ""
    done = log.done
    calls = done.get("judge/calls_total", total("judge/calls"))
    tokens_in = done.get("judge/tokens_in_total", total("judge/tokens_in"))
    tokens_out = done.get("judge/tokens_out_total", total("judge/tokens_out"))
    bits = [
        f"calls <b>{int(calls)}</b>",
        f"answered from the cache {int(total('judge/cache_hits'))} (kept on disk by earlier "
        f"runs: {int(total('judge/disk_hits'))})",
        f"tokens in {int(tokens_in)}, out {int(tokens_out)}",
    ]
    if "judge/cost" in log.series or "judge/cost_total" in done:
        bits.append(f"cost <b>{done.get('judge/cost_total', total('judge/cost')):.4g}</b>")
    # every batch with failures logs judge_failures, the steps the guard threw away included
    # (their metrics were never logged)
    failed = sum(int(e.get("failed") or 0) for e in log.judge_failures)
    fallbacks = sum(int(e.get("without_verdict") or 0) for e in log.judge_failures)
    fallbacks = fallbacks or int(total("reward/judge_fallbacks"))
    failures = f"failed calls {failed}, answers scored by the fallback {fallbacks}"
    bits.append(f'<span class="warning">{failures}</span>' if failed else failures)
    agree = [v for _, v in log.series.get("reward/judge_vs_em", ())]
    if agree:
        bits.append(
            f"agrees with EM on <b>{100 * sum(agree) / len(agree):.1f}%</b> (mean of steps)"
        )
    return f'<h2 id="judge">Reward judge</h2>\n<p id="judge-spend">{" · ".join(bits)}</p>'


def _ending_html(log: RunLog) -> str:
    """How ``train`` ended, from the run's last events (:attr:`RunLog.ending`): a stop and
    its cause first on the page; nothing for other commands."""
    end, name = log.ending, str(log.ending.get("event", ""))
    if log.start.get("command") != "train" or not end:
        return ""
    if name == "train_done":
        return f'<p id="run-end">finished: {int(end.get("steps") or 0)} steps</p>'
    if name == "stopped":  # a signal: asked for, not a failure
        kept = end.get("checkpoint") or "no checkpoint"
        text = (
            f"stopped by {end.get('signal', 'a signal')} during {end.get('phase', '?')}; "
            f"kept: {kept}"
        )
        return f'<p id="run-end"><b>{escape(text)}</b></p>'
    if name == "train_stopped":
        code = f" (exit {end['exit_code']})" if end.get("exit_code") is not None else ""
        return (
            f'<p class="warning" id="run-end">training stopped early{code}: '
            f"{escape(str(end.get('reason', '')))}</p>"
        )
    return (
        '<p class="warning" id="run-end">no end recorded: the run is still going, or its '
        "process was killed</p>"
    )


def _config_html(log: RunLog) -> str:
    """The run's settings as its newest checkpoint saved them (secrets redacted)."""
    if not log.config_text:
        return ""
    return (
        '<h2 id="config">Config</h2>\n<details id="run-config"><summary>the newest checkpoint\'s '
        f"config.toml</summary><pre>{escape(log.config_text)}</pre></details>"
    )


def render_page(log: RunLog, png_names: Sequence[str] = ()) -> str:
    """The whole report page for one run."""
    main_keys = {k for spec in (*CHARTS, *HEALTH_CHARTS) for k in spec.keys}
    charts = "".join(svg_chart(spec, log.series) for spec in CHARTS)
    extra_keys = sorted(k for k in log.series if k not in main_keys)
    extra_specs = [
        ChartSpec(f"m-{i}", k, (k,)) for i, k in enumerate(extra_keys[:_MAX_EXTRA_CHARTS])
    ]
    extra = "".join(svg_chart(spec, log.series) for spec in extra_specs)

    meta = [f"run <b>{escape(log.run_id)}</b>"]
    if log.start.get("command"):
        meta.append(f"command {escape(str(log.start['command']))}")
    if log.start.get("config_source"):
        meta.append(f"config {escape(str(log.start['config_source']))}")
    if log.last_step is not None:
        meta.append(f"last step {log.last_step}")
    if log.bad_lines:
        meta.append(f'<span class="warning">{log.bad_lines} unreadable log lines skipped</span>')

    step_means = dict(log.series.get("reward/mean", ()))
    steps = "".join(
        _group_html(f"step {step}", f"step-{step}", trajs, step_means.get(float(step)))
        for step, trajs in sorted(log.trajectories.items())
    )
    evals = "".join(
        _group_html(f"eval {label}", f"eval-{label}", records)
        for label, records in log.eval_records.items()
    )
    pngs = ", ".join(f'<a href="{escape(n)}">{escape(n)}</a>' for n in png_names)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>searchr1 report · {escape(log.run_id)}</title><style>{_CSS}</style></head>
<body>
<h1>searchr1 report</h1>
<p class="meta">{" · ".join(meta)}</p>
{_ending_html(log)}
<h2 id="health">Health</h2>
{health_html(log)}
{_spend_html(log)}
{_judge_html(log)}
<h2 id="curves">Training curves</h2>
<div class="grid" id="charts">{charts}</div>
{f'<p class="meta">PNG copies: {pngs}</p>' if pngs else ""}
<h2 id="eval">Eval results</h2>
{_eval_table(log.evals)}
<h2 id="samples">Sample trajectories</h2>
{steps or '<p class="nodata">no trajectory dumps (train.dump_trajectories = 0?)</p>'}
{f'<h2 id="eval-samples">Eval trajectories</h2>{evals}' if evals else ""}
{_config_html(log)}
<h2 id="more">More metrics</h2>
{f'<details id="more-metrics"><summary>{len(extra_specs)} more logged metrics</summary><div class="grid">{extra}</div></details>' if extra else '<p class="nodata">none</p>'}
<script>{_JS}</script>
</body></html>
"""
