"""A tiny world for eval tests: a corpus, a held-out file and a config for the tiny random
model (``write_world``)."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    {"id": "1", "contents": '"Velmora"\nVelmora is a city founded by Ada Quill in 1851.'},
    {"id": "2", "contents": '"Orlin River"\nThe Orlin River flows through Velmora and Kessa.'},
    {"id": "3", "contents": '"Kessa"\nKessa is known for its glass towers and its mayor Bo Reed.'},
]
QUESTIONS = [
    # (id, source, question, golden, scripted behaviour)
    ("a", "nq", "Who founded Velmora?", ["Ada Quill"], ("search", "Ada Quill")),
    ("b", "nq", "Which river flows through Kessa?", ["Orlin River"], ("answer", "Orlin")),
    ("c", "hotpotqa", "Who is the mayor of Kessa?", ["Bo Reed"], ("search", "Bo Reed")),
    ("d", "hotpotqa", "When was Velmora founded?", ["1851"], ("ramble", None)),
    ("e", "hotpotqa", "What is Kessa known for?", ["glass towers"], ("search", "glass towers")),
]


def write_world(root: Path) -> Path:
    """A corpus, a held-out file and a config for the tiny random model; returns the config."""
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    (root / "heldout.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "question": q, "golden_answers": g, "data_source": s}) + "\n"
            for i, s, q, g, _ in QUESTIONS
        )
    )
    config = root / "config.toml"
    config.write_text(
        f"""
[run]
dir = "{root / "runs"}"
seed = 0
[model]
provider = "local"
base_model = "builtin:tiny-random"
max_new_tokens = 16
device = "cpu"
[lora]
rank = 4
alpha = 8
[rollout]
protocol = "tags"
max_search_calls = 2
max_assistant_turns = 3
max_trajectory_tokens = 320
max_observation_tokens = 48
[search]
provider = "local"
top_k = 2
[search.local]
corpus = "{root / "corpus.jsonl"}"
[train]
max_datum_tokens = 512
max_micro_batch_tokens = 4096
[data]
eval = "{root / "heldout.jsonl"}"
"""
    )
    return config
