"""What the commands print, for a pipe and for a person: with stdout not a terminal
(``searchr1 train | jq``) every stdout line is a JSON event and what a person reads (the
config chosen, smoke's verdict, eval's tables) is on stderr, without library progress bars;
on a terminal the console says each config choice once."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from cli_run import make_config

#: one step of the tiny model (the config's choice of max_staleness is said: it is not set)
ONE_STEP = make_config(train={"max_steps": 1, "save_every": 1})
CONFIG_LINE = "config: config.toml (--config)"
STALENESS = "train.max_staleness = 0: not set"
#: what a tqdm bar draws (transformers' "Loading weights" among them)
BAR_MARKS = ("\r", "it/s]", "Loading weights")


def _json_lines(out: str) -> list[dict]:
    """Every line of ``out`` parsed as JSON (the test fails on the first that is not)."""
    lines = out.splitlines()
    assert lines, "no events on stdout"
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    ("command", "last_event"),
    [
        (["train"], "train_done"),
        (["smoke"], "smoke_done"),
        (
            ["eval", "--data", "builtin:world/heldout.jsonl", "--limit-per-source", "1"],
            "eval_result",
        ),
    ],
)
def test_piped_stdout_is_json_events_and_people_read_stderr(
    tmp_path: Path, config_file, run_cli, monkeypatch, command, last_event
) -> None:
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # restored after
    config = config_file(ONE_STEP)
    monkeypatch.chdir(tmp_path)
    result = run_cli(*command, "--config", config.name, "--run-dir", "run")
    assert result.code in ((0, 3) if command == ["smoke"] else (0,)), result.err
    events = _json_lines(result.out)
    assert events[0]["event"] == "run_start"
    assert last_event in {e["event"] for e in events}
    assert result.err.count(CONFIG_LINE) == 1 and result.err.count(STALENESS) == 1
    assert not any(mark in result.err for mark in BAR_MARKS), result.err[:2000]
    if command == ["smoke"]:
        assert "search probe: ok" in result.err and "smoke: " in result.err
    if command[0] == "eval":
        assert "== base" in result.err and "macro EM" in result.err


class _Terminal(io.StringIO):
    """Stdout as a terminal: the commands draw their console on it."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_config_choice_is_said_once(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    config = config_file(ONE_STEP)
    monkeypatch.chdir(tmp_path)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    result = run_cli("train", "--config", config.name, "--run-dir", "run")
    seen = terminal.getvalue() + result.err  # a person sees both streams
    assert result.code == 0, seen
    # the config line once (not run_start again); the first screen's resume command names it too
    assert seen.count("config: config.toml") == 1, seen
    assert seen.count(STALENESS) == 1, seen
    assert '{"' not in terminal.getvalue()  # drawn for a person, not JSON


def test_config_check_prints_its_report_on_stdout_and_logs_a_model_build_on_stderr(
    tmp_path: Path, run_cli, monkeypatch
) -> None:
    """On a machine that has not built the config's model yet, ``config check`` builds it (to
    read its ``config.json`` and tokenizer): the build's events go to stderr as JSON lines with
    a sentence for a person, and stdout starts with the verdict, as a script reading it
    expects."""
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cold-cache"))
    text = '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    config = tmp_path / "config.toml"
    config.write_text(text + '[model]\nbase_model = "builtin:tiny-random"\n')
    result = run_cli("config", "check", "--config", config)
    assert result.code == 0, result.err
    assert result.out.startswith(f"# {config}: OK"), result.out[:300]
    built = [json.loads(line) for line in result.err.splitlines() if line.startswith("{")]
    events = {(event["event"], event["asset"]) for event in built}
    assert {("asset_building", "builtin:tiny-random"), ("asset_built", "builtin:tiny-random")} <= (
        events
    ), result.err[:2000]
    assert "searchr1: building builtin:tiny-random (first use" in result.err
    assert not any(mark in result.err for mark in BAR_MARKS), result.err[:2000]
