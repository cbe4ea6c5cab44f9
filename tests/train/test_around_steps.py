"""What ``searchr1 train`` runs around its steps, through the CLI: the held-out eval before and
after (its file read, and its skipped rows reported, once) and the cold start's eval between."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import read_events
from metric_docs import undocumented
from train_configs import QUESTIONS, train_config


def _with_heldout(config: Path, tmp_path: Path, bad_rows: int = 0) -> None:
    """Turn on the held-out eval with a file of the training questions (+ ``bad_rows``)."""
    heldout = tmp_path / "heldout.jsonl"
    rows = [json.dumps({"question": q, "answers": ["France"]}) for q in QUESTIONS[:2]]
    heldout.write_text("\n".join(rows + ["{not json"] * bad_rows) + "\n")
    text = config.read_text().replace("eval_before_after = false", "eval_before_after = true")
    config.write_text(text.replace("[data]\n", f'[data]\neval = "{heldout}"\n'))


def test_the_heldout_eval_runs_before_after_and_after_the_cold_start_reading_its_file_once(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """The held-out eval and the cold start's eval share data.eval: one warning about its
    malformed row, and the three evals ran in order around the steps; --resume runs none
    before its steps and the eval after them once it reaches max_steps."""
    config = train_config(tmp_path, extra="[train.cold_start]\nsteps = 1\nquestions_per_step = 2\n")
    _with_heldout(config, tmp_path, bad_rows=1)
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result.err
    assert result.err.count("skipped 1 malformed rows") == 1, result.err
    first = read_events(run)
    assert [e["when"] for e in first if e["event"] == "eval/heldout_em"] == [
        "before",
        "cold_start",
        "after",
    ]
    order = [e["event"] for e in first]
    assert order.index("cold_start_done") < order.index("metrics")
    assert (run / "checkpoints" / "step_000000").is_dir()  # after the cold start
    assert not undocumented(first)  # the evals' and cold start's events: docs/reference/metrics.md

    config.write_text(config.read_text().replace("max_steps = 2", "max_steps = 3"))
    assert run_cli("train", "--config", config, "--run-dir", run, "--resume").code == 0
    resumed = read_events(run)[len(first) :]
    assert [e["when"] for e in resumed if e["event"] == "eval/heldout_em"] == ["after"]
    assert not [e for e in resumed if e["event"].startswith("cold_start")]
