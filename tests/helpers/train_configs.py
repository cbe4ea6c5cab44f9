"""A short training run on the scripted provider (``tests/helpers/fakes.py``) for CLI tests of
the train loop: four questions, two scripted trajectories per group with different rewards."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import read_events
from smoke_configs import local_search, write_config

#: two scripts per group that earn different rewards (so no group is degenerate)
TURNS = [["<search> little prince author </search>", "<answer> France </answer>"],
         ["<answer> Paris </answer>"]]  # fmt: skip
QUESTIONS = ["Where was the author of The Little Prince born?", "Which country is Lyon in?",
             "Where is Lyon?", "Which country did Saint-Exupéry come from?"]  # fmt: skip


def train_config(tmp_path: Path, scripted: str = "", train: str = "", extra: str = "") -> Path:
    """A two-step training run on the scripted provider, its ``[model.scripted]`` table
    extended by ``scripted`` and ``[train]`` by ``train``."""
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "answers": ["France"]}) + "\n" for q in QUESTIONS)
    )
    model = (
        '[model]\nprovider = "scripted"\nmax_new_tokens = 64\n'
        f"[model.scripted]\nturns = {json.dumps(TURNS)}\n{scripted}"
    )
    path = write_config(
        tmp_path,
        model,
        local_search(tmp_path),
        'protocol = "tags"\nquestions_per_batch = 2\ngroup_size = 2',
    )
    text = path.read_text().replace(
        "[train]\n",
        "[train]\nmax_steps = 2\nsave_every = 2\neval_before_after = false\n" + train,
    )
    path.write_text(text + f'[data]\ntrain = "{data}"\n{extra}')
    return path


def events(run: Path) -> list[dict]:
    return read_events(run)
