"""The cold start on a user's own QA data and corpus: the scripted teacher, the masks of
its datums, the supervised loss, and ``searchr1 train`` with ``[train.cold_start]`` end to end on a
tiny random Llama (a real transformers architecture, loaded by path)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from arch_models import build_family
from cli_run import read_events, write_config
from fakes import template_tokenizer, tiny_tokenizer

from searchr1.cli.main import main as cli
from searchr1.core.config import load_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.scripted import UNKNOWN, ScriptedTeacher
from searchr1.core.types import LossInputs, Question
from searchr1.plugins.local_search import LocalBM25Search
from searchr1.plugins.losses import cross_entropy
from searchr1.rl.datums import trajectory_to_datum
from searchr1.rl.rollout import rollout_questions, sampling_params

FACTS = [
    ("Who painted the Blue Door?", "Marta Quell", "The Blue Door is a painting by Marta Quell."),
    ("Which river runs through Olvik?", "Sarn", "Olvik is a town on the river Sarn."),
    ("Who built the Tallow Bridge?", "Iden Ross", "The Tallow Bridge was built by Iden Ross."),
    ("What is the capital of Venmark?", "Holt", "Venmark is a country; its capital is Holt."),
    ("Who wrote the Salt Ledger?", "Ona Brill", "The Salt Ledger was written by Ona Brill."),
    ("Which sea borders Caldia?", "Grey Sea", "Caldia lies on the coast of the Grey Sea."),
]
#: a question whose answer no document holds
UNANSWERABLE = Question("q-none", "Who founded the Ember Guild?", ("Pell Yarrow",))


def write_user_data(folder: Path) -> dict[str, Path]:
    """A user's own corpus (plain title/text rows) and QA files ({"question","answers"})."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"title": q.split()[-1].rstrip("?"), "text": text}) + "\n"
            for q, _, text in FACTS
        )
    )
    train = folder / "train.jsonl"
    train.write_text(
        "".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a, _ in FACTS)
    )
    heldout = folder / "heldout.jsonl"
    heldout.write_text(
        "".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a, _ in FACTS[:2])
    )
    return {"corpus": corpus, "train": train, "heldout": heldout}


def _search_config(files: dict[str, Path], protocol: str) -> object:
    config = load_config(None, registry=load_registry())
    config = config.replace(
        rollout={"protocol": protocol, "max_trajectory_tokens": 2048, "max_observation_tokens": 96},
        model={"max_new_tokens": 96},
        search={"top_k": 1},
    )
    plugins = {**config.plugins, "search.local": {"corpus": str(files["corpus"])}}
    return dataclasses.replace(config, plugins=plugins)


def _teacher_trajectories(tmp_path: Path, protocol_name: str, tokenizer: object) -> list:
    files = write_user_data(tmp_path / "data")
    config = _search_config(files, protocol_name)
    protocol = make_protocol(config, tokenizer, load_registry())
    questions = [Question(f"q{i}", q, (a,)) for i, (q, a, _) in enumerate(FACTS[:2])]
    questions.append(UNANSWERABLE)
    teacher = ScriptedTeacher(tokenizer, protocol, questions)

    async def run() -> list:
        search = LocalBM25Search.from_config(config)
        try:
            groups = await rollout_questions(
                teacher,
                search,
                protocol,
                questions,
                config,
                group_size=1,
                sampling=sampling_params(config, protocol, greedy=True),
            )
        finally:
            await search.aclose()
        return [g[0] for g in groups]

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("protocol_name", "tokenizer"),
    [("tags", "tiny"), ("tool_calls", "qwen3"), ("tool_calls", "qwen3_5")],
)
def test_the_teacher_searches_the_question_and_answers_from_the_results(
    tmp_path: Path, protocol_name: str, tokenizer: str
) -> None:
    tok = tiny_tokenizer() if tokenizer == "tiny" else template_tokenizer(tokenizer)
    trajectories = _teacher_trajectories(tmp_path, protocol_name, tok)
    for trajectory, (question, answer, _) in zip(trajectories[:2], FACTS[:2], strict=True):
        assert [t.action for t in trajectory.turns] == ["search", "answer"], trajectory.turns
        assert trajectory.turns[0].query == question
        assert trajectory.final_answer == answer
        assert trajectory.end_reason == "answered"
    # Nothing in the corpus holds the answer: the teacher says so (and the stage drops it).
    assert trajectories[-1].final_answer == UNKNOWN


def test_cold_start_datums_weigh_the_teachers_tokens_only(tmp_path: Path) -> None:
    trajectory = _teacher_trajectories(tmp_path, "tags", tiny_tokenizer())[0]
    datum = trajectory_to_datum(trajectory, 1.0, 4096)
    weighted = [i + 1 for i, a in enumerate(datum.advantages) if a]
    # Exactly the tokens the teacher "sampled", never the prompt or the search results.
    assert weighted == [i for i, g in enumerate(trajectory.generated_mask) if g]
    turn_tokens = sum(len(t.sampled_tokens) for t in trajectory.turns)
    assert len(weighted) == turn_tokens
    observation = trajectory.turns[0].observation_tokens
    assert observation and len(trajectory.tokens) > trajectory.prompt_len + turn_tokens


def test_cross_entropy_is_the_weighted_negative_log_likelihood() -> None:
    logprobs_T = torch.tensor([-0.5, -2.0, -1.0, -3.0], requires_grad=True)
    weights_T = torch.tensor([0.0, 1.0, 1.0, 0.0])
    out = cross_entropy(logprobs_T, LossInputs(torch.zeros(4), weights_T))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0)
    assert logprobs_T.grad.tolist() == [0.0, -1.0, -1.0, 0.0]  # untrained positions: no gradient
    assert out.metrics["tokens"] == 2.0 and out.metrics["nll_sum"] == pytest.approx(3.0)


CONFIG = """
[run]
seed = 3
dir = "{runs}"
[model]
provider = "local"
base_model = "{model}"
temperature = 1.0
top_p = 1.0
max_new_tokens = 24
[model.local]
threads = 1
[lora]
rank = 8
alpha = 16
dropout = 0.0
target_modules = "all-linear"
[rollout]
protocol = "tags"
questions_per_batch = 2
group_size = 2
max_search_calls = 1
max_assistant_turns = 2
max_trajectory_tokens = 600
max_observation_tokens = 48
[search]
provider = "local"
top_k = 1
[search.local]
corpus = "{corpus}"
[train.cold_start]
steps = {cold_steps}
questions_per_step = 4
lr = 1e-2
loss_fn = "{loss}"
[train]
max_steps = {max_steps}
save_every = 1
max_datum_tokens = 640
max_micro_batch_tokens = 4096
eval_before_after = true
[data]
train = "{train}"
eval = "{heldout}"
"""


def _write_config(tmp_path: Path, model: Path, **values: object) -> Path:
    files = write_user_data(tmp_path / "data")
    settings = {"cold_steps": 4, "max_steps": 1, "loss": "cross_entropy", **values}
    text = CONFIG.format(
        runs=tmp_path / "runs", model=model, **{k: str(v) for k, v in files.items()}, **settings
    )
    return write_config(tmp_path, text)


def test_train_runs_the_cold_start_before_rl_and_resume_skips_it(tmp_path: Path) -> None:
    model = build_family("llama", tmp_path / "llama")
    config = _write_config(tmp_path, model)
    run = tmp_path / "run"
    assert cli(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    events = read_events(run)
    steps = [e for e in events if e["event"] == "cold_start.step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    # Every question of the user's data is answerable from its corpus: all kept.
    done = next(e for e in events if e["event"] == "cold_start_done")
    assert done["kept"] == done["trajectories"] == 16
    assert steps[-1]["loss"] < steps[0]["loss"]  # it imitates the teacher
    evals = [e["when"] for e in events if e["event"] == "eval/heldout_em"]
    assert evals == ["before", "cold_start", "after"]
    assert (run / "checkpoints" / "step_000000").is_dir()  # the stage's own checkpoint
    order = [e["event"] for e in events]
    assert order.index("cold_start_done") < order.index("metrics")  # before the first RL step

    # A resumed run continues RL; the stage is never repeated.
    config.write_text(config.read_text().replace("max_steps = 1", "max_steps = 2"))
    assert cli(["train", "--config", str(config), "--run-dir", str(run), "--resume"]) == 0
    resumed = read_events(run)[len(events) :]
    assert not [e for e in resumed if e["event"].startswith("cold_start")]
    assert [e["step"] for e in resumed if e["event"] == "metrics"] == [2]


def test_an_unknown_cold_start_loss_is_named_before_the_model_loads(
    tmp_path: Path, run_cli
) -> None:
    config = _write_config(tmp_path, tmp_path / "no-model-here", loss="cross_entropi")
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "r")
    err = result.err
    assert result.code == 2, err
    assert "cold_start.loss_fn = 'cross_entropi'" in err and "cross_entropy" in err, err


def test_removed_keys_are_named_with_what_to_write_instead(tmp_path: Path) -> None:
    """A top-level ``[cold_start]`` and ``[train] stages``/``monitors`` (older configs) are
    unknown now: the error names each with its line and says where its settings went."""
    config = _write_config(tmp_path, tmp_path / "model", cold_steps=3)
    text = config.read_text().replace("[train.cold_start]", "[cold_start]")
    config.write_text(
        text.replace("[train]\n", '[train]\nstages = ["cold_start"]\nmonitors = []\n')
    )
    with pytest.raises(ConfigError) as info:
        load_config(config, registry=load_registry())
    said = "\n".join(info.value.problems)
    assert (
        "unknown section 'cold_start' (no longer read: its settings are [train.cold_start]'s"
        in said
    )
    assert "unknown key 'train.stages' (no longer read: train runs the held-out eval" in said
    assert (
        "unknown key 'train.monitors' (no longer read: train always runs the health checks" in said
    )
    assert re.search(rf"{re.escape(str(config))}:\d+: unknown key 'train.stages'", said), said
