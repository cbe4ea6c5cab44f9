"""Small smoke configs for CLI tests: a three-document corpus about The Little Prince, the
scripted model's table, and ``smoke`` through the shared ``run_cli`` fixture."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from cli_run import Result

CORPUS = [
    {"id": "1", "title": "The Little Prince", "text": "A novella by Antoine de Saint-Exupéry."},
    {"id": "2", "title": "Antoine de Saint-Exupéry", "text": "A French writer born in Lyon."},
    {"id": "3", "title": "Lyon", "text": "Lyon is a city in France."},
]
TRAJECTORY_LINE = re.compile(
    r"^trajectory (\d+): reward=(-?\d\.\d), search_calls=(\d+), final_answer=(.*)$", re.M
)


def write_config(
    tmp_path: Path, model: str, search: str, rollout: str = 'protocol = "tags"'
) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in CORPUS), encoding="utf-8")
    path = tmp_path / "config.toml"
    path.write_text(
        f'[run]\ndir = "{tmp_path / "runs"}"\n'
        f"{model}\n"
        f"[rollout]\nmax_trajectory_tokens = 512\nmax_assistant_turns = 6\n{rollout}\n"
        "[train]\nmax_datum_tokens = 512\nmax_micro_batch_tokens = 4096\n"
        f"{search}\n",
        encoding="utf-8",
    )
    return path


LOCAL_SEARCH = '[search]\nprovider = "local"\ntop_k = 2\n[search.local]\ncorpus = "{corpus}"\n'


def local_search(tmp_path: Path) -> str:
    return LOCAL_SEARCH.format(corpus=tmp_path / "corpus.jsonl")


def scripted(turns: list[list[str]], fail: str | None = None) -> str:
    table = f"[model.scripted]\nturns = {json.dumps(turns)}\n"
    if fail:
        table += f"fail = {json.dumps(fail)}\n"
    return f'[model]\nprovider = "scripted"\nmax_new_tokens = 64\n{table}'


def smoke(run_cli: Callable[..., Result], config: Path, *extra: str) -> tuple[int, str]:
    """``searchr1 smoke`` on ``config`` into ``run`` next to it: the exit code and what it
    said (stderr: stdout, not a terminal here, carries the run's JSON events)."""
    result = run_cli("smoke", "--config", config, "--run-dir", config.parent / "run", *extra)
    return result.code, result.err
