"""Train stages through ``searchr1 train``: a third party's stage runs in ``[train] stages``
order around the RL steps (``check`` always, ``before_steps`` on fresh runs only,
``after_steps`` when the run reaches ``max_steps``), its True writes checkpoint 0, a stage
object without the contract's methods is refused by name, and a held-out file is read (and
its skipped rows reported) once however many stages use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import read_events
from train_configs import QUESTIONS, train_config

from searchr1.core.hookspecs import hookimpl


class Recorder:
    """A stage that records its calls in ``calls`` and claims it trained the weights."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def check(self, run):
        self.calls.append("check")

    def before_steps(self, run):
        self.calls.append(f"before:{run.config.train.max_steps}")
        return True

    def after_steps(self, run, step):
        self.calls.append(f"after:{step}")


@pytest.fixture
def recorder(scripted_plugin, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every registry a command loads also holds ``recorder`` and a broken ``half`` stage."""
    from searchr1.core import plugins

    calls: list[str] = []

    class Plugin:
        __name__ = "stage_test_plugin"

        @hookimpl
        def register_train_stages(self, register):
            register("recorder", lambda config: Recorder(calls))
            register("half", lambda config: object())

    with_scripted = plugins.load_registry
    monkeypatch.setattr(
        plugins, "load_registry", lambda extra=(): with_scripted([Plugin(), *extra])
    )
    return calls


def _with_heldout(config: Path, tmp_path: Path, bad_rows: int = 0) -> None:
    """Turn on the held-out eval with a file of the training questions (+ ``bad_rows``)."""
    heldout = tmp_path / "heldout.jsonl"
    rows = [json.dumps({"question": q, "answers": ["France"]}) for q in QUESTIONS[:2]]
    heldout.write_text("\n".join(rows + ["{not json"] * bad_rows) + "\n")
    text = config.read_text().replace("eval_before_after = false", "eval_before_after = true")
    config.write_text(text.replace("[data]\n", f'[data]\neval = "{heldout}"\n'))


def test_a_third_party_stage_runs_around_the_steps_and_resume_skips_it(
    tmp_path: Path, run_cli, recorder
) -> None:
    config = train_config(tmp_path, train='stages = ["recorder"]\n')
    _with_heldout(config, tmp_path)
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result.err
    assert recorder == ["check", "before:2", "after:2"]
    assert (run / "checkpoints" / "step_000000").is_dir()  # its True: checkpoint 0
    # The built-in stages are not listed, so no held-out eval runs although it is configured.
    assert not read_events(run, "eval/heldout_em")

    # Resumed at max_steps: checked again, never run before the steps, and no step ran, so
    # nothing after them either.
    recorder.clear()
    assert run_cli("train", "--config", config, "--run-dir", run, "--resume").code == 0
    assert recorder == ["check"]
    # Resumed with more steps: the stage's after_steps sees the new last step.
    config.write_text(config.read_text().replace("max_steps = 2", "max_steps = 3"))
    recorder.clear()
    assert run_cli("train", "--config", config, "--run-dir", run, "--resume").code == 0
    assert recorder == ["check", "after:3"]


def test_a_stage_without_the_contract_is_refused_by_name(tmp_path: Path, run_cli, recorder):
    config = train_config(tmp_path, train='stages = ["recorder", "half"]\n')
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code != 0
    assert "train stage 'half' (plugin 'stage_test_plugin')" in result.err, result.err
    assert "without check, before_steps, after_steps" in result.err
    assert recorder == []  # refused before any stage ran


def test_the_heldout_file_is_read_once_for_every_stage_that_uses_it(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    """The held-out eval and the cold start's eval share data.eval: one warning about its
    malformed row, not one per stage, and both evals ran."""
    config = train_config(
        tmp_path,
        train='stages = ["heldout_eval", "cold_start"]\n',
        extra="[train.cold_start]\nsteps = 1\nquestions_per_step = 2\n",
    )
    _with_heldout(config, tmp_path, bad_rows=1)
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result.err
    assert result.err.count("skipped 1 malformed rows") == 1, result.err
    evals = [e["when"] for e in read_events(run, "eval/heldout_em")]
    assert evals == ["before", "cold_start", "after"]
