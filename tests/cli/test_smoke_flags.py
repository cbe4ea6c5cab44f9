"""``searchr1 smoke`` refuses flags that cannot mean anything (exit 2, naming the flags), and a
``--run-dir`` that holds another command's run, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from smoke_configs import smoke
from train_configs import train_config


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--answer", "France"], ("--answer", "--question")),
        (["--max-search-calls", "0"], ("--max-search-calls",)),
    ],
    ids=["answer_without_question", "no_searches"],
)
def test_smoke_refuses_flags_that_mean_nothing(tmp_path: Path, run_cli, flags, named) -> None:
    result = run_cli("smoke", "--run-dir", tmp_path / "run", *flags)
    assert result.code == 2, result.out + result.err
    (line,) = [e for e in result.err.splitlines() if e.startswith("searchr1: error:")]
    assert line.startswith("searchr1: error: smoke ") and all(f in line for f in named), line
    assert not (tmp_path / "run").exists()  # refused before the run folder


def test_smoke_refuses_a_training_runs_folder(tmp_path: Path, run_cli, scripted_plugin) -> None:
    """Its events.jsonl would interleave smoke's events with the training run's (the report
    and ``--resume`` read the folder as one run); the same command may reuse its own."""
    config = train_config(tmp_path)
    trained = run_cli("train", "--config", config, "--run-dir", tmp_path / "train-run")
    assert trained.code == 0, trained.err
    events = (tmp_path / "train-run" / "events.jsonl").read_bytes()
    result = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "train-run")
    assert result.code == 2, result.out + result.err
    assert f"--run-dir {tmp_path / 'train-run'}: " in result.err
    assert "holds a `searchr1 train` run" in result.err and "a new smoke-* folder" in result.err
    assert (tmp_path / "train-run" / "events.jsonl").read_bytes() == events
    assert not (tmp_path / "train-run" / "smoke_trajectories.jsonl").exists()
    for _ in range(2):  # smoke into a smoke run's folder: as before
        code, out = smoke(run_cli, config, "--group-size", "2")
        assert code == 3, out  # it ran: the channels work, the two scripts lack both signs
