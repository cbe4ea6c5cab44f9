"""Command-line numbers are checked (exit code 2 naming the flag), a reader that closes the
output early ends a command quietly, ``--version`` names the installed version, and dropped
data rows are shown on the console, not only counted in a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from searchr1.core.data import load_questions


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "flag", "bound"),
    [
        (["train", "--max-steps", "-1"], "--max-steps", ">= 0"),
        (["smoke", "--group-size", "0"], "--group-size", ">= 1"),
        (["smoke", "--max-search-calls", "-2"], "--max-search-calls", ">= 0"),
        (["eval", "--limit-per-source", "0"], "--limit-per-source", ">= 1"),
        (["train", "--max-steps", "lots"], "--max-steps", "whole number"),
    ],
)
def test_bad_numbers_are_usage_errors(project: Path, run_cli, argv, flag, bound) -> None:
    result = run_cli(*argv)
    assert result.code == 2
    assert flag in result.err and bound in result.err
    assert not (project / "runs").exists()  # refused before any run started


def test_usage_errors_return_2_in_process(project: Path, run_cli) -> None:
    typo = run_cli("trian")
    assert typo.code == 2 and "invalid choice" in typo.err
    assert run_cli("--help").code == 0


def test_version_prints_the_installed_version(project: Path, run_cli) -> None:
    result = run_cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"searchr1 {version('searchr1')}"


@pytest.mark.parametrize("argv", [["plugins"], ["config", "check"]])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(project: Path, argv) -> None:
    """``searchr1 plugins | head -1``: the reader is gone before the command writes (its end
    of the pipe closed), so every write meets a broken pipe, as the tail of a long output
    does behind ``head``."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "SEARCHR1_CONFIG"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "searchr1.cli", *argv],
            cwd=project,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 141  # what a shell reports for a tool SIGPIPE ended


def test_a_bom_at_the_start_of_a_jsonl_file_loses_no_row(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}?", "answers": [f"a{i}"]} for i in range(3)]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    loaded = load_questions(str(path), {})
    assert [q.question for q in loaded.questions] == ["q0?", "q1?", "q2?"]
    assert loaded.malformed == ()


def _mixed_rows(path: Path) -> Path:
    lines = [
        json.dumps({"question": "Where was Ada born?", "answers": ["London"]}),
        "{broken",
        json.dumps({"question": "", "answers": ["x"]}),
        json.dumps({"question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}),
        json.dumps({"answers": ["y"]}),
        json.dumps({"question": "q", "answers": []}),
        json.dumps([1, 2]),
        json.dumps({"question": "q2", "answers": 3.5, "data_source": 7}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_reports_dropped_rows_when_asked(tmp_path: Path, capsys) -> None:
    path = _mixed_rows(tmp_path / "mixed.jsonl")
    loaded = load_questions(str(path), {}, field_name="data.train", report=True)
    err = capsys.readouterr().err
    assert len(loaded.questions) == 2
    assert "data.train" in err and "skipped 6 malformed rows of 8" in err
    assert "row 2: not valid JSON" in err and "row 3: empty 'question'" in err
    assert "and 1 more" in err and "searchr1 data check" in err
    load_questions(str(path), {})  # without report=True (data check prints its own list)
    assert capsys.readouterr().err == ""


TINY = """
[model]
provider = "local"
base_model = "builtin:tiny"
max_new_tokens = 8
[rollout]
protocol = "tags"
questions_per_batch = 1
group_size = 2
max_search_calls = 0
max_assistant_turns = 1
max_trajectory_tokens = 256
[search]
provider = "local"
[search.local]
corpus = "builtin:world/corpus.jsonl"
[train]
max_steps = 0
max_datum_tokens = 512
max_micro_batch_tokens = 1024
dump_trajectories = 0
[data]
train = "mixed.jsonl"
eval = "mixed.jsonl"
"""


@pytest.mark.parametrize("command", ["train", "eval"])
def test_train_and_eval_show_dropped_rows_on_the_console(
    project: Path, config_file, run_cli, command
) -> None:
    _mixed_rows(project / "mixed.jsonl")
    config_file(TINY)
    result = run_cli(command, "--config", "config.toml", "--run-dir", "run")
    err = result.err
    assert result.code == 0, err
    field = "data.train" if command == "train" else "data.eval"
    assert f"{field} = 'mixed.jsonl': skipped 6 malformed rows of 8" in err
    assert "row 2: not valid JSON" in err
