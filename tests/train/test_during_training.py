"""What ``searchr1 train`` does between its steps, through the CLI: the periodic held-out eval
(``[train] eval_every``) and the best checkpoint (``keep_best``, ``searchr1 eval --checkpoint
RUN:best``), the KL term toward the start policy (``[train.loss] kl_coef``), and a health alert
that stops the run (``[train.health] on_alert = "stop"``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import make_config, read_events
from train_configs import TINY_TRAIN, train_config

HELDOUT = "builtin:world/heldout.jsonl"


def _best_of(evals: list[dict]) -> tuple[int, float]:
    """The earliest step with the highest held-out EM among the periodic evals."""
    periodic = sorted((e["step"], e["em"]) for e in evals if e["when"].startswith("step_"))
    best = max(value for _, value in periodic)
    return next(step for step, value in periodic if value == best), best


@pytest.mark.slow
def test_periodic_eval_keeps_the_best_checkpoint_and_kl_starts_at_zero(
    tmp_path: Path, config_file, run_cli
) -> None:
    """Three steps of the tiny model, held-out EM on 4 questions at steps 0, 2 and 3, the
    best kept; KL to the start policy: 0 at step 1 (the policy is the start policy), then the
    adapter moves away from it. A resume to step 4 keeps the best so far."""
    run = tmp_path / "run"
    train = {
        "save_every": 10,
        "eval_every": 2,
        "eval_questions": 4,
        "keep_best": True,
        "loss": {"kl_coef": 0.5},
    }
    config = config_file(
        make_config(TINY_TRAIN, train={**train, "max_steps": 3}, data={"eval": HELDOUT})
    )
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result.out + result.err

    evals = read_events(run, "eval/heldout_em")
    assert [(e["when"], e["step"], e["n"]) for e in evals] == [
        ("step_0", 0, 4),
        ("step_2", 2, 4),
        ("step_3", 3, 4),
    ]
    # a balanced subset: both skills of the world in every periodic eval
    assert {"em/world_1hop", "em/world_2hop"} <= set(evals[0])
    metrics = {e["step"]: e for e in read_events(run, "metrics")}
    assert "eval/heldout_em" not in metrics[1]
    for e in evals[1:]:
        m = metrics[e["step"]]
        assert m["eval/heldout_em"] == e["em"]
        assert m["eval/heldout_em/world_2hop"] == e["em/world_2hop"]

    # KL: the first step scores the start policy itself; the update moves the adapter away
    assert metrics[1]["kl/mean"] == pytest.approx(0.0, abs=1e-6)
    assert all(m["kl/mean"] >= 0.0 for m in metrics.values() if "kl/mean" in m)
    assert max(m.get("kl/mean", 0.0) for m in metrics.values()) > 1e-6

    # the report draws the held-out EM curve from the metrics events
    assert run_cli("report", run, "--out", tmp_path / "report", "--no-png").code == 0
    assert (
        "<figcaption>eval/heldout_em</figcaption>"
        in (tmp_path / "report" / "index.html").read_text()
    )

    best_step, best_em = _best_of(evals)
    saved = json.loads((run / "checkpoints" / "best" / "trainer.json").read_text())
    assert saved["step"] == best_step
    assert saved["best_heldout"]["em"] == best_em
    (done,) = read_events(run, "best_checkpoint")
    assert done["step"] == best_step and f"{run}:best" in done["message"]

    # `searchr1 eval --checkpoint RUN:best` evaluates that checkpoint
    result = run_cli(
        "eval",
        "--config",
        config,
        "--checkpoint",
        f"{run}:best",
        "--limit-per-source",
        "1",
        "--run-dir",
        tmp_path / "eval",
    )
    assert result.code == 0, result.out + result.err
    assert f"best_step_{best_step}" in result.err  # eval's table (stdout: JSON events)

    # resumed to one more step: the best so far is kept, not restarted
    more = config_file(
        make_config(TINY_TRAIN, train={**train, "max_steps": 4}, data={"eval": HELDOUT}),
        "more.toml",
    )
    result = run_cli("train", "--config", more, "--run-dir", run, "--resume")
    assert result.code == 0, result.out + result.err
    evals = read_events(run, "eval/heldout_em")
    assert [e["when"] for e in evals][-1] == "step_4"
    best_step, best_em = _best_of(evals)
    saved = json.loads((run / "checkpoints" / "best" / "trainer.json").read_text())
    assert (saved["step"], saved["best_heldout"]["em"]) == (best_step, best_em)


def test_a_health_alert_with_on_alert_stop_checkpoints_and_exits_5(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """A length-growth threshold under 1 trips at step 1: the run saves that step and stops
    with exit code 5 and a message naming the alert and the setting."""
    config = train_config(
        tmp_path, extra='[train.health]\non_alert = "stop"\nmax_length_growth = 0.5\n'
    )
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 5, result.out + result.err
    assert "health alert length_growth at step 1" in result.err
    assert 'on_alert = "stop"' in result.err
    assert sorted(e["step"] for e in read_events(run, "metrics")) == [1]  # of max_steps = 2
    assert (run / "checkpoints" / "step_000001" / "trainer.json").is_file()
    (stopped,) = read_events(run, "train_stopped")
    assert stopped["alert"] == "length_growth"


def test_a_kl_term_trains_the_sampled_tokens_of_degenerate_groups(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """Both scripts of every group answer correctly, so every group is degenerate. Without a
    KL term nothing is trained; with one, every trajectory reaches the trainer with advantage
    0 and the policy's tokens marked ``sampled`` (the KL term's tokens), so the term anchors
    the skill those groups show instead of leaving it to drift."""
    correct = [["<answer> France </answer>"], ["<answer>France</answer>"]]
    trained = {}
    for kl in (0.0, 0.1):
        folder = tmp_path / f"kl{kl}"
        folder.mkdir()
        config = train_config(
            folder,
            scripted="kl_reference = true\n",
            extra=f"[train.loss]\nkl_coef = {kl}\n",
            turns=correct,
        )
        result = run_cli("train", "--config", config, "--run-dir", folder / "run")
        assert result.code == 0, result.out + result.err
        metrics = read_events(folder / "run", "metrics")
        assert [m["degenerate_group_rate"] for m in metrics] == [1.0, 1.0]
        model = scripted_plugin.created[-1]
        trained[kl] = (model, [m.get("groups") for m in metrics])

    model, groups = trained[0.0]
    assert model.trained == [] and groups == [None, None]  # exactly questions_per_batch
    model, groups = trained[0.1]
    assert len(model.trained) == 2 * 2 * 2  # steps x questions x group_size
    assert groups == [2.0, 2.0]  # every degenerate group kept
    for datum in model.trained:
        assert set(datum.advantages) == {0.0}
        sampled = [t for t, s in zip(datum.target_tokens, datum.sampled, strict=True) if s]
        assert "France" in model.tokenizer.decode(sampled)
        assert sum(datum.sampled) < len(datum)  # the prompt is never sampled


def test_settings_that_cannot_work_are_refused_before_training(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """eval_every without a held-out file, keep_best without eval_every, and a KL term on a
    trainer that cannot score the reference policy: exit 2 naming the field; RUN:best of a
    run that kept none names the setting."""
    cases = {
        "eval_every = 2\n": "train.eval_every = 2 needs a held-out QA file",
        "keep_best = true\n": "train.keep_best = true",
    }
    for line, message in cases.items():
        folder = tmp_path / f"case{len(line)}"
        folder.mkdir()
        config = train_config(folder, train=line)
        result = run_cli("train", "--config", config, "--run-dir", folder / "run")
        assert result.code == 2, result.out + result.err
        assert message in result.out + result.err
    # the scripted provider declares no kl_reference
    (tmp_path / "kl").mkdir()
    (tmp_path / "plain").mkdir()
    config = train_config(tmp_path / "kl", extra="[train.loss]\nkl_coef = 0.1\n")
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "kl" / "run")
    assert result.code == 2, result.out + result.err
    assert "train.loss.kl_coef = 0.1" in result.out + result.err
    assert not list((tmp_path / "kl" / "run").glob("checkpoints/step_*"))

    result = run_cli(
        "train", "--config", train_config(tmp_path / "plain"), "--run-dir", tmp_path / "r"
    )
    assert result.code == 0, result.out + result.err
    result = run_cli(
        "eval",
        "--config",
        tmp_path / "plain" / "config.toml",
        "--checkpoint",
        f"{tmp_path / 'r'}:best",
    )
    assert result.code == 2
    assert "keep_best" in result.out + result.err


def test_a_long_steps_rollouts_show_their_progress_a_short_ones_do_not(
    tmp_path: Path, config_file, run_cli
) -> None:
    """Rollouts that run past 2 s (every search answers after 2.5 s, a real loopback retriever)
    log ``progress`` events of their groups, the last one whole (a terminal shows a bar); the
    same run with a quick search logs none."""
    from search_fakes import Behaviour, start_fake_retriever

    def rollout_progress(latency_s: float, name: str) -> list[dict]:
        with start_fake_retriever(Behaviour(latency_s=latency_s)) as (base, _):
            search = {"provider": "search_r1", "api_base": base, "local": None, "cache": False}
            text = make_config(
                search=search,
                rollout={"questions_per_batch": 3, "max_search_calls": 1},
                train={"max_steps": 1},
            )
            result = run_cli("train", "--config", config_file(text), "--run-dir", tmp_path / name)
        assert result.code == 0, result.err
        (metrics,) = read_events(tmp_path / name, "metrics")
        assert metrics["search/calls"] > 0  # the step searched: it waited on the retriever
        events = read_events(tmp_path / name, "progress")
        return [e for e in events if e["task"] == "step 1 rollouts"]

    slow = rollout_progress(2.5, "slow")
    assert slow and slow[-1]["done"] == slow[-1]["total"] == 3, slow
    assert [e["done"] for e in slow] == sorted({e["done"] for e in slow})
    assert rollout_progress(0.0, "quick") == []


def test_fewer_questions_than_a_batch_warns_and_trains(tmp_path: Path, run_cli) -> None:
    """One question under questions_per_batch = 2: each step draws it twice, which a file
    mix-up (the held-out file as data.train, a filter gone wrong) looks like, so it is said."""
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question": "Who founded Sistan Group?", "answers": ["x"]}) + "\n")
    config = tmp_path / "config.toml"
    config.write_text(
        make_config(
            rollout={"questions_per_batch": 2}, train={"max_steps": 1}, data={"train": str(data)}
        )
    )
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    assert (
        f"searchr1: warning: data.train = '{data}' holds 1 question, fewer than "
        f"rollout.questions_per_batch = 2 ({config}:"
    ) in result.err
    (event,) = read_events(tmp_path / "run", "data_fewer_than_a_batch")
    assert "the same questions several times over" in event["detail"]
    assert len(read_events(tmp_path / "run", "metrics")) == 1  # it trains on


def test_held_out_questions_that_are_training_ones_warn(tmp_path: Path, run_cli) -> None:
    """data.eval naming the training file (a mix-up): the held-out EM would not be held out."""
    questions = ["Who founded Sistan Group?", "Where is Mobu?", "Who leads Zunmun?"]
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "answers": ["x"]}) + "\n" for q in questions)
    )
    train = str(data)
    config = tmp_path / "config.toml"
    config.write_text(
        make_config(
            train={"max_steps": 0, "eval_before_after": True}, data={"train": train, "eval": train}
        )
    )
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    (event,) = read_events(tmp_path / "run", "heldout_in_train")
    assert (
        f"held-out questions of data.eval = '{train}' are in data.train = '{train}' too"
        in (event["detail"])
    )
    assert "searchr1: warning: " in result.err and "check that data.eval" in result.err
    assert not read_events(tmp_path / "run", "data_fewer_than_a_batch")


def test_a_question_too_long_for_the_token_limit_is_skipped_not_fatal(
    tmp_path: Path, run_cli
) -> None:
    """A large QA set has a few rows whose prompt alone fills max_trajectory_tokens: drawn
    hours into a run, one ended it (exit 2). It is skipped with a warning naming it; a file
    where no question fits is refused."""
    rows = [
        {"id": "long", "question": "Who founded Sistan Group? " + "lorem " * 600, "answers": ["x"]},
        {"id": "short-1", "question": "Who founded Sistan Group?", "answers": ["Tirma Parzes"]},
        {"id": "short-2", "question": "Where is Mobu?", "answers": ["x"]},
    ]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.toml"
    train = {"max_steps": 3, "dump_trajectories": 64}
    config.write_text(
        make_config(rollout={"questions_per_batch": 2}, train=train, data={"train": str(data)})
    )
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    assert "searchr1: warning: data.train: question 'long': the prompt alone has " in result.err
    assert "no room left in rollout.max_trajectory_tokens = 384: it is skipped" in result.err
    skipped = read_events(tmp_path / "run", "question_skipped")
    assert skipped and all("'long'" in e["detail"] for e in skipped)
    assert len(read_events(tmp_path / "run", "metrics")) == 3
    dumped = [
        json.loads(line)["question"]
        for path in sorted((tmp_path / "run" / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert dumped and not [q for q in dumped if "lorem" in q]  # never rolled out

    data.write_text(json.dumps(rows[0]) + "\n")
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run2")
    assert result.code == 2, result.err
    assert "no question leaves room in rollout.max_trajectory_tokens = 384" in result.err


def test_a_held_out_question_too_long_is_refused_before_training(tmp_path: Path, run_cli) -> None:
    """eval_every's first eval may come hours in: its questions are checked when the model
    has loaded, before any step."""
    rows = [
        {"question": "Who founded Sistan Group?", "answers": ["Tirma Parzes"]},
        {"id": "long", "question": "Who? " + "lorem " * 600, "answers": ["x"]},
    ]
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.toml"
    config.write_text(
        make_config(
            train={"max_steps": 4, "eval_every": 2, "eval_before_after": False},
            data={"eval": str(heldout)},
        )
    )
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 2, result.err
    assert "data.eval: question 'long': the prompt alone has " in result.err
    assert not read_events(tmp_path / "run", "metrics")
