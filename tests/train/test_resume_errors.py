"""Resume and run-folder mistakes end in a plain message and exit code 2, never a traceback.

Checkpoints here are written by the real :func:`searchr1.core.checkpoint.save_checkpoint`
with a real data cursor; only the model's own state is a stand-in (a folder with one file),
because every case below must be refused before a model is loaded. The one case that does
resume (falling back past a damaged checkpoint) trains the real tiny model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from cli_run import Result, make_config, read_events

from searchr1.core.checkpoint import CheckpointError, save_checkpoint
from searchr1.core.config import load_config
from searchr1.core.data import load_questions
from searchr1.core.plugins import load_registry
from searchr1.core.question_stream import QuestionStream


def _config(data: str, **run: str) -> str:
    """A two-step run on the questions in ``data``, ``[run]`` changed by ``run``."""
    return make_config(
        run={"dir": "runs", **run},
        train={
            "save_every": 1,
            "max_micro_batch_datums": 4,
            "max_micro_batch_tokens": 1024,
            "dump_trajectories": 0,
        },
        data={"train": data},
    )


class _StateWriter:
    """Stands in for a model provider: save_checkpoint only asks it to fill ``model/``."""

    def save_state(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "state.json").write_text("{}")


def _write_data(path: Path, n: int) -> Path:
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": [f"a{i}"]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    _write_data(tmp_path / "a.jsonl", 5)
    _write_data(tmp_path / "b.jsonl", 7)
    (tmp_path / "config.toml").write_text(_config("a.jsonl"))
    return tmp_path


def _checkpoint(
    project: Path, run_dir: Path, step: int, data: str = "a.jsonl", provider: str = "local"
) -> Path:
    config = load_config(project / "config.toml", registry=load_registry()).replace(
        data={"train": data}, model={"provider": provider}
    )
    stream = QuestionStream(load_questions(data, config.assets).questions, seed=1)
    stream.next_batch(step)
    return save_checkpoint(run_dir, step, _StateWriter(), config, {"data": stream.state()})  # type: ignore[arg-type]


def _code_and_err(result: Result) -> tuple[int, str]:
    """A command's exit code and stderr, checking it printed no traceback."""
    assert "Traceback" not in result.out + result.err
    return result.code, result.err


def test_resume_with_nothing_to_resume_is_an_error_not_a_fresh_run(project: Path, run_cli):
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2
    assert "--resume" in err and "nothing to resume" in err and "runs" in err
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_resume_of_a_folder_without_checkpoints_is_an_error(project: Path, run_cli):
    (project / "runs" / "train-1").mkdir(parents=True)
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2
    assert "train-1" in err and "no checkpoint" in err
    rc, err = _code_and_err(
        run_cli("train", "--config", "config.toml", "--resume", "--run-dir", "nope")
    )
    assert rc == 2 and "nope" in err and "nothing to resume" in err
    assert not (project / "nope").exists()


def test_resume_with_other_data_names_both_files(project: Path, run_cli):
    run_dir = project / "runs" / "train-1"
    _checkpoint(project, run_dir, 2, data="a.jsonl")
    (project / "config.toml").write_text(_config("b.jsonl"))
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2
    assert "'a.jsonl'" in err and "'b.jsonl'" in err and "data.train" in err
    assert "step_000002" in err


@pytest.mark.parametrize(
    ("lora", "named"),
    [
        ({"rank": 8}, "lora.rank = 4; this config has lora.rank = 8 (config.toml:"),
        ({"alpha": 16.0}, "lora.alpha = 8.0; this config has lora.alpha = 16.0 (config.toml:"),
        ({"target_modules": ["q_proj"]}, "lora.target_modules = ['q_proj', 'k_proj', 'v_proj'"),
    ],
)
def test_resume_with_another_adapter_shape_names_both_values_before_the_model_loads(
    project: Path, run_cli, lora: dict, named: str
):
    run_dir = project / "runs" / "train-1"
    _checkpoint(project, run_dir, 2)
    (project / "config.toml").write_text(make_config(tomllib.loads(_config("a.jsonl")), lora=lora))
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2, err
    assert "step_000002 holds an adapter trained with " + named in err, err
    assert "step_000002/config.toml" in err and "local_model_loaded" not in err


def test_resume_on_another_base_model_warns_naming_both(project: Path, run_cli):
    run_dir = project / "runs" / "train-1"
    _checkpoint(project, run_dir, 2)
    text = make_config(
        tomllib.loads(_config("a.jsonl")), model={"base_model": "builtin:tiny-random"}
    )
    (project / "config.toml").write_text(text)
    _, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert (
        "warning: runs/train-1/checkpoints/step_000002 was trained on model.base_model = "
        "'builtin:tiny', this config has 'builtin:tiny-random'"
    ) in err, err
    (event,) = read_events(run_dir, "resume_base_model_changed")
    assert "same model under another path" in event["detail"]


def test_resume_of_another_providers_state_names_the_provider_that_saved_it(project: Path, run_cli):
    _checkpoint(project, project / "runs" / "train-1", 1, provider="tinker")
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2, err
    assert "step_000001/model cannot be loaded" in err, err
    assert "saved by model provider 'tinker' and this run's is 'local'" in err
    assert "move" not in err.split("cannot be loaded")[1]  # the checkpoint is not damaged


def test_resume_at_max_steps_says_nothing_is_left_to_train(project: Path, run_cli):
    _checkpoint(project, project / "runs" / "train-1", 2)  # the config's max_steps is 2
    _, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert (
        "warning: runs/train-1/checkpoints/step_000002 is at step 2 and train.max_steps is 2 "
        "(config.toml:"
    ) in err, err
    assert "raise train.max_steps (or give --max-steps)" in err
    (event,) = read_events(project / "runs" / "train-1", "resume_nothing_to_train")
    assert "no step is left to train" in event["detail"]


def test_resume_past_a_max_steps_flag_names_the_flag(project: Path, run_cli):
    _checkpoint(project, project / "runs" / "train-1", 2)
    _, err = _code_and_err(
        run_cli("train", "--config", "config.toml", "--resume", "--max-steps", "1")
    )
    assert "is at step 2 and train.max_steps is 1 (--max-steps): no step is left" in err, err
    assert "to train on, give a larger --max-steps" in err


@pytest.mark.parametrize("how", [("--run-dir", "runs/old"), ()])
def test_a_new_run_into_a_folder_with_checkpoints_is_refused(project: Path, run_cli, how):
    """By --run-dir or by run.name: its checkpoints would sit among the old run's, and a
    later --resume would continue the old run's newest one."""
    old = _checkpoint(project, project / "runs" / "old", 3)
    (project / "config.toml").write_text(_config("a.jsonl", name="old"))
    before = sorted(p.name for p in old.parent.iterdir())
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", *how))
    assert rc == 2, err
    assert "'runs/old' already holds a train run (checkpoints up to step_000003)" in err, err
    assert "--resume" in err
    assert sorted(p.name for p in old.parent.iterdir()) == before


def test_a_second_train_of_a_folder_being_trained_is_refused_naming_the_process(
    project: Path, run_cli
):
    long = make_config(run={"dir": "runs"}, train={"max_steps": 100000, "save_every": 1})
    (project / "long.toml").write_text(long)
    first = subprocess.Popen(
        [sys.executable, "-m", "searchr1.cli", "train", "--config", "long.toml"]
        + ["--run-dir", "runs/busy"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        checkpoints = project / "runs" / "busy" / "checkpoints"
        deadline = time.monotonic() + 120
        while not checkpoints.is_dir() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None and checkpoints.is_dir()
        for how in (("--resume",), ()):
            rc, err = _code_and_err(
                run_cli("train", "--config", "long.toml", "--run-dir", "runs/busy", *how)
            )
            assert rc == 2, err
            if how:  # a new run is refused first for the checkpoints it would mix with
                assert f"'runs/busy' is being trained by process {first.pid} now" in err, err
                assert f"kill -TERM {first.pid}" in err
    finally:
        first.terminate()
        first.wait(timeout=60)
    assert first.returncode == 143
    rc, err = _code_and_err(
        run_cli("train", "--config", "config.toml", "--run-dir", "runs/busy", "--resume")
    )
    assert "is being trained" not in err  # the lock went with the process


def test_a_command_started_in_the_same_second_as_another_gets_its_own_folder(
    project: Path, run_cli
):
    """``smoke-<second>`` is taken (by another smoke of that second): this one gets
    ``smoke-<second>-2``, and writes nothing into the other's folder."""
    now = time.time()
    taken = [
        project / "runs" / f"smoke-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + d))}"
        for d in range(6)  # this second and the next five: the command starts in one of them
    ]
    for folder in taken:
        folder.mkdir(parents=True)
    rc, err = _code_and_err(run_cli("smoke", "--config", "config.toml"))
    made = sorted(p for p in (project / "runs").iterdir() if p not in taken)
    assert len(made) == 1 and made[0].name.endswith("-2"), (made, err)
    assert made[0].name.removesuffix("-2") in {f.name for f in taken}
    assert (made[0] / "events.jsonl").is_file()
    assert all(not any(f.iterdir()) for f in taken)


def test_a_damaged_only_checkpoint_names_the_file(project: Path, run_cli):
    run_dir = project / "runs" / "train-1"
    folder = _checkpoint(project, run_dir, 2)
    (folder / "trainer.json").write_text('{"step": 2, "data": {"epo')
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2
    assert "runs/train-1/checkpoints/step_000002/trainer.json is damaged" in err
    assert "no earlier" in err


@pytest.mark.parametrize(
    "damage",
    ["", "[1, 2]", '{"step": "two"}', '{"step": 2, "python_rng": [], "data": {}}'],
)
def test_damaged_trainer_json_falls_back_to_the_previous_checkpoint(project: Path, damage: str):
    from searchr1.core.checkpoint import resume_checkpoint

    run_dir = project / "runs" / "train-1"
    _checkpoint(project, run_dir, 1)
    bad = _checkpoint(project, run_dir, 2)
    (bad / "trainer.json").write_text(damage)
    checkpoint, warnings = resume_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.step == 1
    assert len(warnings) == 1
    assert str(bad / "trainer.json") in warnings[0] and "step_000001" in warnings[0]


def test_run_dir_that_is_a_file(project: Path, run_cli):
    (project / "taken").write_text("x")
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--run-dir", "taken"))
    assert rc == 2
    assert "--run-dir" in err and "taken" in err and "file" in err


def test_run_dir_config_that_is_a_file(project: Path, run_cli):
    (project / "runs").write_text("x")
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml"))
    assert rc == 2
    assert "run.dir" in err and "runs" in err


@pytest.mark.parametrize("name", ["checkpoints", "trajectories"])
def test_a_file_where_train_keeps_a_folder_is_refused_before_any_step(
    project: Path, run_cli, name: str
):
    (project / "run").mkdir()
    (project / "run" / name).write_text("x")
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--run-dir", "run"))
    assert rc == 2
    assert f"'run/{name}' is a file" in err and "--run-dir run" in err
    assert not (project / "run" / "events.jsonl").exists()  # refused before the run began


def test_a_file_where_a_checkpoint_goes_is_named_and_nothing_is_written(project: Path):
    run_dir = project / "runs" / "train-1"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000002").write_text("x")
    with pytest.raises(CheckpointError, match="step_000002 is a file where train saves"):
        _checkpoint(project, run_dir, 2)
    assert (run_dir / "checkpoints" / "step_000002").read_text() == "x"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000002"]


def test_eval_checkpoint_that_is_not_a_checkpoint(project: Path, run_cli):
    (project / "somewhere").mkdir()
    (project / "somewhere" / "notes.txt").write_text("hi")
    rc, err = _code_and_err(
        run_cli("eval", "--config", "config.toml", "--data", "a.jsonl", "--checkpoint", "somewhere")
    )
    assert rc == 2
    assert "--checkpoint" in err and "somewhere" in err and "not a checkpoint" in err
    # refused before the run started, so before any model was loaded
    assert not (project / "runs").exists()


def test_eval_checkpoint_with_damaged_trainer_json(project: Path, run_cli):
    folder = _checkpoint(project, project / "runs" / "train-1", 2)
    (folder / "trainer.json").write_text("{")
    rc, err = _code_and_err(
        run_cli("eval", "--config", "config.toml", "--data", "a.jsonl", "--checkpoint", str(folder))
    )
    assert rc == 2
    assert str(folder / "trainer.json") in err and "damaged" in err


@pytest.mark.slow
def test_resume_falls_back_past_a_damaged_checkpoint_and_trains(project: Path):
    """End to end on the tiny model: two checkpoints, the newer one's trainer.json broken;
    ``--resume`` says so, continues from step 1 and finishes with exit 0."""
    (project / "config.toml").write_text(_config("builtin:world/train.jsonl"))
    run = [sys.executable, "-m", "searchr1.cli", "train", "--config", "config.toml"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.run(
        [*run, "--run-dir", "runs/r"], cwd=project, env=env, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stdout + first.stderr
    (project / "runs/r/checkpoints/step_000002/trainer.json").write_text("{not json")
    again = subprocess.run(
        [*run, "--run-dir", "runs/r", "--resume"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    assert "step_000002/trainer.json" in again.stderr and "step_000001" in again.stderr
    events = read_events(project / "runs/r")
    assert any(e["event"] == "resumed" and e["step"] == 1 for e in events)
    assert (
        json.loads((project / "runs/r/checkpoints/step_000002/trainer.json").read_text())["step"]
        == 2
    )


def test_run_dir_a_path_cannot_hold(project: Path, run_cli):
    (project / "config.toml").write_text(_config("a.jsonl", dir="a\x00b"))
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml"))
    assert rc == 2
    assert "run.dir" in err and "cannot create the run folder" in err


def test_resume_of_a_named_run_uses_its_folder(project: Path, run_cli):
    (project / "config.toml").write_text(_config("a.jsonl", name="exp"))
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2 and "run.name = 'exp'" in err and "nothing to resume" in err
    _checkpoint(project, project / "runs" / "exp", 1, data="a.jsonl")
    (project / "config.toml").write_text(_config("b.jsonl", name="exp"))
    rc, err = _code_and_err(run_cli("train", "--config", "config.toml", "--resume"))
    assert rc == 2 and "runs/exp/checkpoints/step_000001" in err  # that run, not a new one


def test_eval_of_a_checkpoint_whose_model_state_does_not_load(project: Path, run_cli):
    folder = _checkpoint(project, project / "runs" / "train-1", 2)  # model/ holds no adapter
    rc, err = _code_and_err(
        run_cli("eval", "--config", "config.toml", "--data", "a.jsonl", "--checkpoint", str(folder))
    )
    assert rc == 2
    assert str(folder / "model") in err and "cannot be loaded" in err
