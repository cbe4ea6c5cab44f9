"""A small ``searchr1 train`` setup for the remote providers' end-to-end tests: a three-document
corpus, three questions, a config template with the model section left open, and a reward
that varies between trajectories."""

from __future__ import annotations

from pathlib import Path

from searchr1.core.hookspecs import hookimpl

CORPUS = [
    {"id": "1", "title": "The Little Prince", "text": "A novella by Antoine de Saint-Exupery."},
    {"id": "2", "title": "Antoine de Saint-Exupery", "text": "A French writer born in Lyon."},
    {"id": "3", "title": "Paris", "text": "Paris is the capital of France."},
]
QUESTIONS = [
    {"id": "q1", "question": "Who wrote The Little Prince?", "golden_answers": ["Saint-Exupery"]},
    {"id": "q2", "question": "Where was Saint-Exupery born?", "golden_answers": ["Lyon"]},
    {"id": "q3", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
]
CLI_CONFIG = """
[run]
seed = 3
[model]
{model}
base_model = "builtin:tiny-random"
temperature = 1.0
top_p = 1.0
max_new_tokens = 12
device = "cpu"
dtype = "float32"
{model_table}
[lora]
rank = 4
alpha = 8
dropout = 0.0
[rollout]
protocol = "tags"
questions_per_batch = 2
group_size = 2
max_search_calls = 1
max_assistant_turns = 2
max_trajectory_tokens = 256
max_observation_tokens = 32
[reward]
name = "token_checksum"
[search]
provider = "local"
top_k = 1
[search.local]
corpus = "{corpus}"
[train]
max_steps = 3
save_every = 2
max_datum_tokens = 512
max_micro_batch_datums = 2
max_micro_batch_tokens = 1024
[optimizer]
lr = 5e-3
[data]
train = "{train}"
"""


def write_cli_config(tmp_path: Path, model: str, model_table: str = "") -> Path:
    import json

    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus, train = tmp_path / "corpus.jsonl", tmp_path / "train.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in CORPUS), encoding="utf-8")
    train.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    path = tmp_path / "config.toml"
    path.write_text(
        CLI_CONFIG.format(model=model, model_table=model_table, corpus=corpus, train=train),
        encoding="utf-8",
    )
    return path


def metric_events(run_dir: Path) -> dict[int, dict]:
    from cli_run import read_events

    return {e["step"]: e for e in read_events(run_dir) if e.get("event") == "metrics"}


class ChecksumRewardPlugin:
    """A reward that varies between trajectories, so every group trains (the untrained tiny
    model never answers, and a constant reward would leave nothing to send to the service)."""

    @staticmethod
    def score(trajectory, golden_answers):
        from searchr1.core.types import RewardResult

        return RewardResult(reward=(sum(trajectory.tokens) % 7) / 6.0)

    @hookimpl
    def register_rewards(self, register):
        register("token_checksum", lambda config: self.score)
