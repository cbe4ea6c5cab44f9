"""Helpers behind the shared ``config_file`` and ``run_cli`` fixtures (``tests/conftest.py``):
a config file written into a folder, and the ``searchr1`` command run in this process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
