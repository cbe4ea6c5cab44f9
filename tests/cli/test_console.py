"""The console a person reads on a TTY: one short line per step, a progress bar, warnings
that stand out, and the full record still in events.jsonl. Without a TTY: JSON lines."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from cli_run import read_events

from searchr1.cli.console import Console, tty_screen
from searchr1.core.logs import get_logger, log_metrics, setup_logging

# a metrics event as the train loop logs it (abridged: the real one has ~50 keys)
STEP = {
    "reward/mean": 0.4125,
    "reward/format": 0.5,  # a reward's component: not what the console shows as format
    "health/format_rate": 0.921875,
    "reward/correct": 0.4,
    "search_rate": 0.625,
    "searches_per_trajectory": 1.21875,
    "degenerate_group_rate": 0.25,
    "end_reason/answered": 0.97,
    "tokens/sampled": 1234.0,
    "optim/grad_norm": 0.31,
    "mismatch/k3": 1e-7,
    "time/rollout": 9.0,
    "time/train": 3.0,
}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plain(text: str) -> str:
    """What a person sees: tqdm redraws (carriage returns) and colour codes removed."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return "\n".join(line.split("\r")[-1] for line in text.split("\n"))


def test_step_lines_are_short_and_hold_what_a_person_watches(tmp_path: Path) -> None:
    stream = Tty()
    run_log = setup_logging(
        "r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream, total_steps=60
    )
    get_logger().info("eval/heldout_em", when="before", step=0, em=0.119, f1=0.2, n=200)
    log_metrics(1, {**STEP, "time/step": 12.0})
    log_metrics(2, {**STEP, "time/step": 14.0, "reward/mean": 0.5})
    run_log.close_console()
    lines = [line for line in _plain(stream.getvalue()).splitlines() if line.strip()]
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[0] == (
        "step  1/60  reward  0.412  format 92%  search 62% 1.22/traj  degenerate 25%  "
        "EM 11.9%  12.0 s/step  ETA 11:48"
    )
    # ETA uses the mean s/step so far: 13 s x 58 steps left
    assert steps[1].endswith("13.0 s/step  ETA 12:34") and "reward  0.500" in steps[1]
    assert all(len(line) <= 120 for line in steps)
    assert any(line.startswith("held-out EM before: 11.9%") for line in lines)
    # the run's progress bar (tqdm) is drawn under the lines and ends at 2/60
    assert re.search(r"train:\s+3%.*\| 2/60", _plain(stream.getvalue()))
    # the full record stays in events.jsonl
    events = read_events(tmp_path)
    assert events[1]["optim/grad_norm"] == 0.31 and events[1]["mismatch/k3"] == 1e-7


def test_warnings_stand_out_and_are_never_cut() -> None:
    screen = Console(Tty(), colors=True, width=60)
    reason = "search success rate 40% over 20 calls is under search.min_success_rate = 90%"
    line = screen(None, "warning", {"event": "guard/no_update", "level": "warning", "step": 3,
                                     "reason": reason, "run_id": "r"})  # fmt: skip
    assert line.startswith("\x1b[1;33m!! WARNING guard/no_update\x1b[0m")
    assert reason in line and "run_id" not in line
    plain = Console(Tty(), colors=False, width=60)
    info = plain(None, "info", {"event": "checkpoint", "level": "info", "path": "x" * 200})
    assert len(info) == 60 and info.endswith("...")
    assert plain(None, "error", {"event": "boom", "level": "error"}).startswith("XX ERROR boom")


def test_without_a_tty_events_stay_json_lines(tmp_path: Path) -> None:
    stream = io.StringIO()
    assert tty_screen(stream) is None
    setup_logging("r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream)
    log_metrics(1, {**STEP, "time/step": 12.0})
    get_logger().warning("sink_failed", sink="x")
    out = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in out] == ["metrics", "sink_failed"]
    assert out[0]["optim/grad_norm"] == 0.31


def test_long_work_gets_a_bar_of_its_own_not_lines(tmp_path: Path) -> None:
    stream = Tty()
    setup_logging(
        "r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream, total_steps=3
    )
    for done in (32, 64, 80):
        get_logger().info("progress", task="held-out eval before", done=done, total=80)
    shown = _plain(stream.getvalue())
    assert re.search(r"held-out eval before:\s+\d+%.*/80", stream.getvalue())
    assert "done=" not in shown  # a bar, not three event lines
    events = read_events(tmp_path)
    assert [e["done"] for e in events] == [32, 64, 80]  # still recorded


def test_the_step_line_shows_the_models_em_never_the_ceiling(tmp_path: Path) -> None:
    """The train loop logs the model's EM ("before"), then the eval set's ceiling (the
    offline world's scripted ideal agent), then steps, then "after": the step line shows the
    model's latest EM, and the ceiling has a line of its own."""
    stream = Tty()
    run_log = setup_logging(
        "r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream, total_steps=2
    )
    log = get_logger()
    log.info("eval/heldout_em", when="before", step=0, em=0.119, n=320)
    log.info("eval/heldout_em", when="ceiling", step=0, em=1.0, n=320)
    log_metrics(1, {**STEP, "time/step": 12.0})
    log.info("eval/heldout_em", when="cold_start", step=1, em=0.25, n=320)
    log_metrics(2, {**STEP, "time/step": 12.0})
    log.info("eval/heldout_em", when="after", step=2, em=0.334, n=320)
    run_log.close_console()
    lines = [line for line in _plain(stream.getvalue()).splitlines() if line.strip()]
    steps = [line for line in lines if line.startswith("step ")]
    assert "EM 11.9%" in steps[0] and "100.0%" not in steps[0]
    assert "EM 25.0%" in steps[1]  # any eval of the model but the ceiling is its latest EM
    assert any(
        line.startswith("held-out EM ceiling (the eval set's ideal agent, not the model): 100.0%")
        for line in lines
    )
    assert any(line.startswith("held-out EM after: 33.4%") for line in lines)


def test_an_em_scored_on_failing_search_is_marked_on_its_line_and_the_step_lines(
    tmp_path: Path,
) -> None:
    stream = Tty()
    run_log = setup_logging(
        "r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream, total_steps=2
    )
    log = get_logger()
    log.info(
        "eval/heldout_em",
        when="before",
        step=0,
        em=0.003,
        search_success_rate=0.0,
        trustworthy=False,
    )
    log_metrics(1, {**STEP, "time/step": 12.0})
    log.info("eval/heldout_em", when="step_1", step=1, em=0.25, trustworthy=True)
    log_metrics(2, {**STEP, "time/step": 12.0})
    run_log.close_console()
    lines = [line for line in _plain(stream.getvalue()).splitlines() if line.strip()]
    (before,) = [line for line in lines if line.startswith("held-out EM before")]
    assert "UNTRUSTED: search success 0%" in before
    first, second = [line for line in lines if line.startswith("step ")]
    assert "EM 0.3% (untrusted: search failed)" in first
    assert "EM 25.0%" in second and "untrusted" not in second


@pytest.mark.slow
def test_a_train_run_with_a_ceiling_shows_the_models_em_on_its_step_lines(
    tmp_path: Path, monkeypatch, scripted_plugin
) -> None:
    """``searchr1 train`` on a TTY, with the offline world's held-out set: the loop evaluates
    the model ("before"), then the world's ceiling (its scripted ideal agent, 100%), then
    steps. The step line carries the model's EM (0%: the scripted model answers "x"), never
    the ceiling's, which has its own line."""
    import sys

    from searchr1.cli.main import main as cli

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "q?", "golden_answers": ["x"]}) + "\n")
    config = tmp_path / "config.toml"
    config.write_text(
        '[model]\nprovider = "scripted"\nmax_new_tokens = 32\n'
        '[model.scripted]\nturns = [["<answer> x </answer>"], ["<answer> y </answer>"]]\n'
        '[rollout]\nprotocol = "tags"\nquestions_per_batch = 1\ngroup_size = 2\n'
        "max_trajectory_tokens = 448\n"
        "[train]\nmax_steps = 1\nmax_datum_tokens = 448\nmax_micro_batch_tokens = 4096\n"
        "eval_before_after = true\n"
        f'[data]\ntrain = "{data}"\neval = "builtin:world/heldout.jsonl"\n'
        '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    )
    stream = Tty()
    monkeypatch.setattr(sys, "stdout", stream)
    assert cli(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    lines = [line for line in _plain(stream.getvalue()).splitlines() if line.strip()]
    (step,) = [line for line in lines if line.startswith("step ")]
    ceilings = [
        re.match(r"held-out EM ceiling \(the eval set's ideal agent, not the model\): ([\d.]+)%", x)
        for x in lines
    ]
    (ceiling,) = [float(m.group(1)) for m in ceilings if m]
    assert ceiling > 50.0  # the ideal agent finds most answers with this tokenizer
    assert "EM 0.0%" in step and f"EM {ceiling:.1f}%" not in step, step
    assert any(line.startswith("held-out EM before: 0.0%") for line in lines)


def test_the_step_line_shows_the_search_cost_of_the_step_and_the_run(tmp_path: Path) -> None:
    stream = Tty()
    run_log = setup_logging(
        "r", tmp_path / "events.jsonl", screen=tty_screen(stream), stream=stream
    )
    log_metrics(1, {**STEP, "search/cost": 0.09})
    log_metrics(2, {**STEP, "search/cost": 0.03})
    log_metrics(3, STEP)  # no cost_per_call: no cost shown
    run_log.close_console()
    steps = [line for line in _plain(stream.getvalue()).splitlines() if line.startswith("step ")]
    assert "search cost 0.09 (run 0.09)" in steps[0]
    assert "search cost 0.03 (run 0.12)" in steps[1]
    assert "cost" not in steps[2]


def test_the_first_screen_of_train_says_what_runs_where_and_how_to_stop_resume_and_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, scripted_plugin
) -> None:
    """On a terminal: plain words first; the resume and report commands it prints work."""
    import shlex

    from train_configs import train_config

    from searchr1.cli.main import main

    config = train_config(tmp_path)
    screen = Tty()
    monkeypatch.setattr("sys.stdout", screen)
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "r")]) == 0
    lines = _plain(screen.getvalue()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("searchr1 train: teaches "))
    intro = dict(line.split(None, 1) for line in lines[start + 1 : start + 7])
    assert "2 steps x 2 questions x 2 trajectories each" in intro["training"]
    assert intro["run"].startswith(f"folder {tmp_path / 'r'}")
    assert intro["stop"].startswith("Ctrl-C: ")
    assert intro["report"].startswith(f"searchr1 report {tmp_path / 'r'}")
    # the printed commands run as printed
    config.write_text(config.read_text().replace("max_steps = 2", "max_steps = 3"))
    resume = shlex.split(intro["resume"])
    assert resume[:3] == ["searchr1", "train", "--resume"]
    monkeypatch.setattr("sys.stdout", Tty())
    assert main(resume[1:]) == 0
    assert main(shlex.split(intro["report"].split("  (")[0])[1:]) == 0
    assert (tmp_path / "r" / "report" / "index.html").is_file()
    assert [e["step"] for e in read_events(tmp_path / "r", "metrics")] == [1, 2, 3]


def test_a_key_benched_for_the_run_reads_so_on_the_console() -> None:
    """``benched_for_s`` is None in the event when a key is benched for the rest of the run
    (a 401, ``key_cooldown_seconds = inf``); the console says that, not ``None``."""
    plain = Console(Tty(), colors=False, width=200)
    event = {"event": "search_key_benched", "level": "warning", "key_index": 1, "reason": "401"}
    line = plain(None, "warning", {**event, "benched_for_s": None})
    assert "benched_for_s=the rest of the run" in line and "None" not in line
    assert "benched_for_s=60" in plain(None, "warning", {**event, "benched_for_s": 60})
