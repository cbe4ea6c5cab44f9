"""Helpers behind the shared ``config_file`` and ``run_cli`` fixtures (``tests/conftest.py``):
a config's text (:func:`make_config`), a config file written into a folder, the ``searchr1``
command run in this process, and the events a run logged (:func:`read_events`)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import tomli_w

if TYPE_CHECKING:
    from searchr1.core.plugins import Registry

#: a short run of the local provider on the tiny model and the offline world: the base every
#: :func:`make_config` changes
TINY_RUN: dict[str, Any] = {
    "run": {"seed": 1},
    "model": {"provider": "local", "base_model": "builtin:tiny", "max_new_tokens": 16},
    "lora": {"rank": 4, "alpha": 8, "dropout": 0.0},
    "rollout": {
        "protocol": "tags",
        "questions_per_batch": 1,
        "group_size": 2,
        "max_search_calls": 1,
        "max_assistant_turns": 2,
        "max_trajectory_tokens": 384,
        "max_observation_tokens": 64,
    },
    "search": {"provider": "local", "top_k": 1, "local": {"corpus": "builtin:world/corpus.jsonl"}},
    "train": {"max_steps": 2, "save_every": 2, "max_datum_tokens": 512},
    "data": {"train": "builtin:world/train.jsonl"},
}


def make_config(*layers: Mapping[str, Any], **sections: Mapping[str, Any] | None) -> str:
    """The TOML text of :data:`TINY_RUN` changed by each of ``layers`` (``{section: keys}``,
    a test file's own run), then by ``sections``: each given section's keys set (a nested
    table, such as ``search={"local": {...}}``, merged key by key; a key set to None removed),
    a section given as None left out."""
    doc = copy.deepcopy(TINY_RUN)

    def merge(into: dict[str, Any], changes: Mapping[str, Any]) -> None:
        for key, value in changes.items():
            if value is None:
                into.pop(key, None)
            elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = copy.deepcopy(value)

    for layer in (*layers, sections):
        for name, changes in layer.items():
            if changes is None:
                doc.pop(name, None)
            else:
                merge(doc.setdefault(name, {}), changes)
    return tomli_w.dumps(doc)


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


def run_cli(
    capsys: pytest.CaptureFixture[str], *argv: str | Path, registry: Registry | None = None
) -> Result:
    """``searchr1 ARGV`` run through ``searchr1.cli.main.main`` (with ``registry``'s plugins
    when given), with what it printed since the last read of ``capsys``."""
    from searchr1.cli.main import main

    code = main([str(arg) for arg in argv], registry=registry)
    out, err = capsys.readouterr()
    return Result(code, out, err)


def read_events(run_dir: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The events of ``run_dir/events.jsonl`` (only those named ``event`` if given), read as
    every reader of it does (:func:`searchr1.core.logs.read_jsonl`); a test run must leave no
    line cut short."""
    from searchr1.core.logs import read_jsonl

    rows, cut = read_jsonl(run_dir / "events.jsonl")
    assert cut == 0, f"{run_dir / 'events.jsonl'}: {cut} line(s) cut short"
    return [e for e in rows if event is None or e.get("event") == event]


def docs_example(hook: str) -> str:
    """The last python example of ``## hook`` in docs/plugins.md, as a plugin author copies it."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    body = re.search(rf"^## {hook}\n(.*?)(?=^## |\Z)", doc, flags=re.M | re.S).group(1)
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)[-1]
