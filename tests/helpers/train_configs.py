"""Training runs for CLI tests of the train loop: a short one on the scripted provider
(``tests/helpers/fakes.py``; four questions, two scripted trajectories per group with
different rewards), and :data:`TINY_TRAIN`, four steps of the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smoke_configs import local_search, write_config

#: two scripts per group that earn different rewards (so no group is degenerate)
TURNS = [["<search> little prince author </search>", "<answer> France </answer>"],
         ["<answer> Paris </answer>"]]  # fmt: skip
QUESTIONS = ["Where was the author of The Little Prince born?", "Which country is Lyon in?",
             "Where is Lyon?", "Which country did Saint-Exupéry come from?"]  # fmt: skip

#: four steps of the tiny model with dynamic sampling, a :func:`cli_run.make_config` layer (the
#: train loop's tests and the metric sinks' run)
TINY_TRAIN: dict[str, dict[str, Any]] = {
    "model": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 24},
    "rollout": {
        "questions_per_batch": 2,
        "group_size": 3,
        "max_search_calls": 2,
        "max_assistant_turns": 3,
        "max_trajectory_tokens": 448,
        "max_observation_tokens": 96,
        "dynamic_sampling": True,
        "max_extra_draws": 6,
    },
    "search": {"top_k": 2},
    "train": {
        "max_steps": 4,
        "max_micro_batch_datums": 4,
        "max_micro_batch_tokens": 1024,
        "dump_trajectories": 64,
    },
    "optimizer": {"lr": 5e-3},
}


def train_config(
    tmp_path: Path,
    scripted: str = "",
    train: str = "",
    extra: str = "",
    turns: list[list[str]] = TURNS,
) -> Path:
    """A two-step training run on the scripted provider playing ``turns``, its
    ``[model.scripted]`` table extended by ``scripted`` and ``[train]`` by ``train``."""
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "answers": ["France"]}) + "\n" for q in QUESTIONS)
    )
    model = (
        '[model]\nprovider = "scripted"\nmax_new_tokens = 64\n'
        f"[model.scripted]\nturns = {json.dumps(turns)}\n{scripted}"
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
