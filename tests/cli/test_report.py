"""``searchr1 report``: the page a person opens after a run, checked in a real browser.

The run folder is synthetic (the names the train loop emits); the browser is Debian's
``chromium`` in headless mode, skipped with a reason where it is not installed
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from searchr1.cli.main import main as cli_main
from searchr1.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
STEPS = 12


def _traj(step: int, i: int, correct: bool) -> dict:
    return {
        "trajectory_id": f"s{step}-g0-{i}",
        "question": f"Who founded Velmora (step {step}, #{i})?",
        "golden_answers": ["Ada Quill"],
        "turns": [
            {
                "text": "<think>I should search.</think><search>Velmora founder</search>",
                "action": "search",
                "query": "Velmora founder",
                "observation_text": "<information>Doc 1(Title: Velmora) founded by Ada Quill <script>alert(1)</script></information>",
                "search_error": None,
            },
            {
                "text": "<answer>Ada Quill</answer>" if correct else "<answer>Bo Reed</answer>",
                "action": "answer",
                "query": None,
                "observation_text": "",
                "search_error": None,
            },
        ],
        "final_answer": "Ada Quill" if correct else "Bo Reed",
        "reward": 1.0 if correct else 0.0,
        "components": {"format": 1.0, "correct": 1.0 if correct else 0.0},
        "end_reason": "answered",
    }


def make_run(run_dir: Path, *, with_tokens: bool = True, with_health: bool = False) -> Path:
    """A run folder shaped like the train loop's: events, metrics, evals, dumps."""
    run_dir.mkdir(parents=True)
    events = [
        {"event": "run_start", "command": "train", "config_source": "x.toml", "run_id": "demo"}
    ]
    # as the train loop logs it: the held-out EM is "em", per source "em/<source>"
    events.append(
        {
            "event": "eval/heldout_em",
            "when": "before",
            "step": 0,
            "em": 0.2,
            "em/nq": 0.25,
            "format_rate": 0.5,
        }
    )
    for step in range(1, STEPS + 1):
        m = {
            "event": "metrics",
            "step": step,
            "timestamp": "2026-01-01T00:00:00Z",
            "reward/mean": 0.1 + 0.05 * step,
            "reward/format": min(1.0, 0.4 + 0.05 * step),
            "reward/correct": 0.03 * step,
            "search/success_rate": 1.0 if step != 7 else 0.6,
            "search/error_rate": 0.0 if step != 7 else 0.4,
            "degenerate_group_rate": 0.5 - 0.02 * step,
            "searches_per_trajectory": 1 + 0.1 * step,
            "time/step": 3.5,
            "loss": -0.01 * step,
        }
        if with_tokens:
            m["tokens/trajectory_mean"] = 100 + 5 * step
        if with_health:
            m |= {
                "health/entropy": 1.2 if step < 9 else 0.2,
                "health/response_tokens": 40.0 + step,
                "health/format_rate": 0.9,
                "health/searches/world_2hop": 1.5 + 0.1 * step,
                "mismatch/k3": 1e-7,
                "mismatch/ratio_min": 0.9999,
                "mismatch/ratio_max": 1.0001,
            }
        events.append(m)
        if with_health and step == 10:
            events.append(
                {
                    "event": "health_alert",
                    "step": 10,
                    "kind": "entropy_cliff",
                    "message": "sampled-token entropy fell off a cliff <b>",
                }
            )
    events.append(
        {
            "event": "eval/heldout_em",
            "when": "after",
            "step": STEPS,
            "em": 0.45,
            "em/nq": 0.5,
            "format_rate": 0.9,
        }
    )
    events.append(
        {
            "event": "eval_result",
            "label": "step_12",
            "data": "heldout.jsonl",
            "n": 70,
            "em": 0.457,
            "macro_em": 0.457,
            "f1": 0.5,
            "search_success_rate": 0.72,
            "trustworthy": False,
        }
    )
    lines = [json.dumps(e) for e in events] + ['{"event": "metrics", "step": 13, "reward/me']
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "trajectories").mkdir()
    for step in (5, 10):
        rows = [_traj(step, i, correct=i == 0) for i in range(3)]
        (run_dir / "trajectories" / f"step_{step:06d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    return run_dir


def test_report_files_and_content(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    files = build_report(run)
    assert files.html == run / "report" / "index.html"
    assert {p.name for p in files.pngs} == {
        "reward.png",
        "search.png",
        "degenerate.png",
        "searches.png",
        "tokens.png",
        "step_time.png",
    }
    for png in files.pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    html = files.html.read_text()
    assert "<script>alert(1)</script>" not in html  # model/search text is escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # no network
    assert "1 unreadable log lines skipped" in html
    assert "45.7%" in html and "not trustworthy" in html
    evals = html[html.index('<table id="evals">') : html.index("</table>")]
    assert "<th>em</th>" in evals and "<th>em/nq</th>" in evals
    assert "20.0%" in evals and "25.0%" in evals and "45.0%" in evals
    assert 'id="chart-m-0"' in html  # the extra "loss" metric gets its own chart


def test_report_is_the_same_bytes_each_time(tmp_path: Path) -> None:
    """The same run gives the same page and PNGs (no date, no random ids), so two reports
    diff cleanly; every chart's ids are its own within the page."""
    run = make_run(tmp_path / "run", with_health=True)
    first, again = build_report(run, tmp_path / "a"), build_report(run, tmp_path / "b")
    html = first.html.read_text()
    assert html == again.html.read_text()
    assert [p.read_bytes() for p in first.pngs] == [p.read_bytes() for p in again.pngs]
    ids = re.findall(r' id="([^"]*)"', html)
    assert len(ids) == len(set(ids))
    assert "<metadata" not in html and "<?xml" not in html


def test_health_section_opens_the_page(tmp_path: Path) -> None:
    html = build_report(make_run(tmp_path / "run", with_health=True), pngs=False).html.read_text()
    top = html[: html.index('<h2 id="curves">')]
    assert '<h2 id="health">' in top
    alerts = top[top.index('id="health-alerts"') :]
    assert "step 10" in alerts and "entropy_cliff" in alerts and "&lt;b&gt;" in alerts
    assert "held-out EM: before <b>20.0%</b> · after <b>45.0%</b>" in top
    table = top[top.index('<table id="health-table">') : top.index("</table>")]
    # first step, last step, min, max of the entropy
    assert "<td>1.2</td><td>0.2</td><td>0.2</td><td>1.2</td>" in table
    assert "world_2hop" in table and "mismatch/ratio_max" in table
    assert "mismatch/logprob_diff_max" in table  # from the ratio extremes
    assert 'id="chart-health-entropy"' in top
    # The plain run (older versions) says there is nothing, instead of an empty table.
    plain = build_report(make_run(tmp_path / "old"), pngs=False).html.read_text()
    assert "no health metrics in this run" in plain and "no health alerts" in plain


def _append(run: Path, *events: dict) -> None:
    with (run / "events.jsonl").open("a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in events))


def test_report_says_what_a_reader_would_misread(tmp_path: Path) -> None:
    """Per-source EM next to the EM, the reward's mean smoothed over the curves it hides, the
    ceiling and an untrusted eval explained, the dumped trajectories' mean told apart from
    the step's, and a few cut turns as a note rather than a red alert."""
    run = make_run(tmp_path / "run", with_health=True)
    _append(
        run,
        {"event": "eval/heldout_em", "when": "ceiling", "step": 0, "em": 0.9, "trustworthy": True},
        {
            "event": "health_alert",
            "step": 3,
            "kind": "max_new_tokens",
            "message": "step 3: 2 of 140 turns ended at model.max_new_tokens = 24",
        },
    )
    text = (run / "events.jsonl").read_text()
    text = text.replace('"when": "after"', '"when": "after", "trustworthy": false')
    (run / "events.jsonl").write_text(text)
    html = build_report(run, pngs=False).html.read_text()
    evals = html[html.index('<table id="evals">') : html.index("</table>", html.index("evals"))]
    heads = re.findall(r"<th>([^<]*)</th>", evals)
    assert heads[heads.index("em") + 1] == "em/nq"  # not scrolled off past every other column
    top = html[: html.index('<h2 id="curves">')]
    red = top[top.index('id="health-alerts"') : top.index("</ul>", top.index("health-alerts"))]
    assert "entropy_cliff" in red and "max_new_tokens" not in red
    notes = top[top.index('id="health-notices"') :]
    assert "2 of 140 turns" in notes[: notes.index("</ul>")]
    assert "ceiling: what the eval set's ideal agent scores" in top
    assert 'after <b>45.0%</b> <span class="warning">(untrusted: search failed)' in top
    # the step's reward/mean (0.1 + 0.05 * 5) beside the mean of the 3 dumped trajectories
    step5 = html[html.index('id="step-5"') :]
    assert "their mean reward 0.333" in step5[:400]
    assert "the step's reward/mean over all its trajectories: 0.350" in step5[:400]
    reward = html[html.index('id="chart-reward"') :]
    reward = reward[: reward.index("</figure>")]
    assert "reward/mean, mean of the last 3 steps" in reward  # the legend of the bold line


def test_report_of_a_stopped_run_says_so_first(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    _append(
        run,
        {"event": "judge_failures", "failed": 6, "calls": 6, "without_verdict": 8},
        {"event": "judge_failures", "failed": 5, "calls": 5, "without_verdict": 7},
        {
            "event": "train_stopped",
            "reason": "step 13: the reward judge gave no verdict",
            "exit_code": 3,
        },
    )
    html = build_report(run, pngs=False).html.read_text()
    end = html[html.index('id="run-end"') : html.index('<h2 id="health">')]
    assert "training stopped early (exit 3): step 13: the reward judge gave no verdict" in end
    judge = html[html.index('id="judge-spend"') :]
    assert "failed calls 11, answers scored by the fallback 15" in judge[: judge.index("</p>")]
    _append(run, {"event": "run_start", "command": "train"})  # resumed, and still going
    html = build_report(run, pngs=False).html.read_text()
    assert "no end recorded: the run is still going" in html
    _append(run, {"event": "train_done", "steps": 20, "stopped_early": False})
    html = build_report(run, pngs=False).html.read_text()
    assert '<p id="run-end">finished: 20 steps</p>' in html


def test_missing_metric_says_so_instead_of_drawing(tmp_path: Path) -> None:
    html = build_report(make_run(tmp_path / "run", with_tokens=False), pngs=False).html.read_text()
    assert '<figure class="chart empty" id="chart-tokens">' in html
    assert "tokens/trajectory_mean, health/response_tokens not logged" in html
    # a sparse diagnostic without a point was 0 on every step, which the chart says
    quiet = make_run(tmp_path / "quiet")
    events = quiet / "events.jsonl"
    text = events.read_text().replace('"search/error_rate": ', '"search/error_rate_": ')
    events.write_text(text)  # the key renamed away: no step logged it
    page = build_report(quiet, pngs=False).html.read_text()
    assert "0 on every step: search/error_rate" in page


def test_report_cli(tmp_path: Path, run_cli) -> None:
    run = make_run(tmp_path / "run")
    assert run_cli("report", run, "--out", tmp_path / "out", "--no-png").code == 0
    assert (tmp_path / "out" / "index.html").is_file()
    assert not list((tmp_path / "out").glob("*.png"))
    missing = run_cli("report", tmp_path / "nope")
    assert missing.code == 2 and "not a folder" in missing.err


@pytest.mark.parametrize("out", ["file.txt", "file.txt/report"])
def test_report_out_that_is_or_lies_under_a_file_names_the_flag(
    tmp_path: Path, run_cli, out: str
) -> None:
    run = make_run(tmp_path / "run")
    (tmp_path / "file.txt").write_text("kept\n")

    result = run_cli("report", run, "--out", tmp_path / out, "--no-png")

    assert result.code == 2
    assert "Traceback" not in result.err
    assert result.err.startswith(f"searchr1: error: --out {tmp_path / out}: cannot make the report")
    assert result.err.count("\n") == 1  # one line
    assert (tmp_path / "file.txt").read_text() == "kept\n"


# --------------------------------------------------------------------------- browser


class _Dom(HTMLParser):
    """Start tags with their attributes, in document order, plus the visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=3000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@needs_chromium
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    html = build_report(run, pngs=False).html
    # A deep link to the second trajectory of step 10: the page's script must expand it.
    url = html.resolve().as_uri() + "#step-10-1"
    dom = _Dom()
    dom.feed(_chromium(["--dump-dom", url], tmp_path / "profile").stdout)

    paths = [a for t, a in dom.tags if t == "path" and "series" in (a.get("class") or "")]
    drawn = {a["data-key"]: float(a.get("data-drawn-length") or 0) for a in paths}
    # Every training curve was laid out by the browser with a real length.
    for key in (
        "reward/mean",
        "reward/format",
        "reward/correct",
        "search/success_rate",
        "search/error_rate",
        "degenerate_group_rate",
        "searches_per_trajectory",
        "tokens/trajectory_mean",
        "time/step",
    ):
        assert drawn.get(key, 0) > 50, (key, drawn)
    # A hover point per logged value, each with its tooltip.
    points = [a for t, a in dom.tags if t == "use" and a.get("class") == "point"]
    assert len(points) >= 9 * STEPS

    details = {a.get("id"): a for t, a in dom.tags if t == "details"}
    assert "open" in details["step-10-1"] and "open" in details["step-10"]
    assert "open" not in details["step-5"] and "open" not in details["step-10-0"]
    assert len([i for i in details if i and i.startswith("step-5-")]) == 3

    # What a person sees: a screenshot with the curves' colours in it.
    from PIL import Image

    shot = tmp_path / "shot.png"
    _chromium(
        ["--window-size=1200,1400", f"--screenshot={shot}", html.resolve().as_uri()],
        tmp_path / "profile2",
    )
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    blue = sum(n for n, rgb in colours if rgb == (0x1F, 0x77, 0xB4))
    green = sum(n for n, rgb in colours if rgb == (0x2C, 0xA0, 0x2C))
    assert blue > 500 and green > 200, (blue, green)


@needs_chromium
@pytest.mark.slow
def test_report_of_a_real_training_run(tmp_path: Path) -> None:
    """Two real training steps of the tiny random model (the lead's train loop, local BM25
    search), then the report in the browser: every main curve is drawn."""
    from eval_world import write_world

    config = write_world(tmp_path)
    text = config.read_text().replace(
        "[rollout]\n", "[rollout]\nquestions_per_batch = 2\ngroup_size = 2\n"
    )
    text = text.replace(
        "[train]\n", "[train]\nmax_steps = 2\nsave_every = 2\ndump_trajectories = 2\n"
    )
    text = text.replace("[data]\n", f'[data]\ntrain = "{tmp_path / "heldout.jsonl"}"\n')
    config.write_text(text)
    run = tmp_path / "train-run"
    assert cli_main(["train", "--config", str(config), "--run-dir", str(run)]) == 0

    files = build_report(run)
    assert len(files.pngs) == 6
    dom = _Dom()
    dom.feed(
        _chromium(
            ["--dump-dom", files.html.resolve().as_uri() + "#step-2-0"], tmp_path / "p"
        ).stdout
    )
    drawn = {
        a["data-key"]: float(a.get("data-drawn-length") or 0)
        for t, a in dom.tags
        if t == "path" and "series" in (a.get("class") or "")
    }
    for spec_keys in (
        "reward/mean",
        "reward/format",
        "reward/correct",
        "search/success_rate",
        "degenerate_group_rate",
        "searches_per_trajectory",
        "tokens/trajectory_mean",
        "time/step",
        "health/entropy",
        "health/response_tokens",
    ):
        assert drawn.get(spec_keys, 0) > 50, (spec_keys, drawn)
    details = {a.get("id"): a for t, a in dom.tags if t == "details"}
    assert "open" in details["step-2-0"] and "open" in details["step-2"]


def test_report_shows_the_config_the_run_saved(tmp_path: Path, run_cli, config_file) -> None:
    """A trained run's report carries its settings (the newest checkpoint's redacted
    config.toml), so a page read on its own says how the curves were made."""
    from helpers.cli_run import make_config

    config = config_file(make_config(rollout={"group_size": 3}, train={"max_steps": 1}))
    run = tmp_path / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    html = build_report(run).html.read_text()
    shown = html[html.index('<details id="run-config">') :]
    shown = shown[: shown.index("</details>")]
    assert "[rollout]" in shown and "group_size = 3" in shown
    assert "max_steps = 1" in shown
