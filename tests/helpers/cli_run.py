"""Helpers behind the shared ``config_file`` and ``run_cli`` fixtures (``tests/conftest.py``):
a config file written into a folder, and the ``searchr1`` command run in this process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Result:
    """What one in-process ``searchr1`` command left: its exit code and what it printed."""

    code: int
    out: str
    err: str


def write_config(folder: Path, text: str, name: str = "config.toml") -> Path:
    """``text`` written to ``folder/name`` (UTF-8), the folder made if missing."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Result:
    """``searchr1 ARGV`` run through ``searchr1.cli.main.main``, with what it printed since the
    last read of ``capsys``."""
    from searchr1.cli.main import main

    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return Result(code, out, err)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of ``run_dir/events.jsonl``, read as every reader of it does
    (:func:`searchr1.core.logs.read_jsonl`); a test run must leave no line cut short."""
    from searchr1.core.logs import read_jsonl

    rows, cut = read_jsonl(run_dir / "events.jsonl")
    assert cut == 0, f"{run_dir / 'events.jsonl'}: {cut} line(s) cut short"
    return rows
