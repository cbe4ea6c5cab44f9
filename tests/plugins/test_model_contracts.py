"""The two model contracts through the CLI: ``searchr1 train`` refuses a provider that only
samples (smoke keeps working with it), a loss the trainer declares it cannot train is named by
the config field that chose it, and the train loop reads the trainer's declared capabilities
(snapshot sampler, learner temperature) instead of probing it. The scripted provider
(``tests/helpers/fakes.py``) declares what each test needs in ``[model.scripted]``."""

from __future__ import annotations

import pytest
from cli_run import read_events
from train_configs import train_config

from searchr1.core.errors import ConfigError
from searchr1.core.trainer_checks import check_loss, require_trainer
from searchr1.core.types import Model, TrainerCapabilities
from searchr1.plugins.losses import NamedLoss, importance_sampling


def test_train_refuses_a_provider_that_only_samples_before_any_rollout(
    tmp_path, run_cli, scripted_plugin
):
    config = train_config(tmp_path, "trains = false\n")
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    err = result.err
    assert result.code == 2, err
    assert "model.provider = 'scripted' only samples" in err and "searchr1 eval" in err, err
    assert "Traceback" not in err
    assert not scripted_plugin.created[0].calls  # nothing was sampled

    # The same provider still serves the commands that only sample.
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    assert smoke.code in (0, 1), smoke  # it ran (the verdict is the script's)
    assert scripted_plugin.created[1].calls


def test_cold_start_loss_the_trainer_cannot_train_names_cold_start_loss_fn(
    tmp_path, run_cli, scripted_plugin
):
    config = train_config(
        tmp_path,
        'losses = ["importance_sampling"]\n',
        extra='[train.cold_start]\nsteps = 1\nquestions_per_step = 2\nloss_fn = "cross_entropy"\n',
    )
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    err = result.err
    assert result.code == 2, err
    assert "cold_start.loss_fn = 'cross_entropy'" in err and "train.loss_fn" not in err, err
    assert "trains only importance_sampling (a scripted test trainer)" in err
    assert not scripted_plugin.created[0].calls  # refused before any rollout


def test_train_loss_the_trainer_cannot_train_names_train_loss_fn(
    tmp_path, run_cli, scripted_plugin
):
    config = train_config(tmp_path, 'losses = ["ppo"]\n')
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    err = result.err
    assert result.code == 2, err
    assert "train.loss_fn = 'importance_sampling'" in err and "trains only ppo" in err, err
    assert not scripted_plugin.created[0].calls


@pytest.mark.parametrize("declared", [False, True])
def test_pipelined_steps_use_the_snapshot_sampler_only_when_declared(
    tmp_path, run_cli, scripted_plugin, declared
):
    """The scripted trainer always has a ``snapshot_sampler`` method; the loop calls it only
    when the capabilities declare it (without, pipelined steps sample the newest weights)."""
    scripted = "snapshot = true\nlearner_temperature = 0.8\n" if declared else ""
    config = train_config(tmp_path, scripted, train="max_staleness = 1\n")
    run = tmp_path / "run"
    result = run_cli("train", "--config", config, "--run-dir", run)
    assert result.code == 0, result
    (model,) = scripted_plugin.created
    # Declared: once before each of the two rollouts and once after the last step.
    assert model.snapshots == (3 if declared else 0)
    logged = read_events(run)
    assert [e["step"] for e in logged if e["event"] == "metrics"] == [1, 2]
    (ratio,) = [e["message"] for e in logged if e["event"] == "importance_ratio"]
    if declared:  # the declared learner temperature, equal to the sampler's
        assert "both at temperature 0.8" in ratio, ratio
    else:  # unknown
        assert "the service's own" in ratio, ratio


def test_check_loss_reads_only_the_declared_losses() -> None:
    loss = NamedLoss("ppo", importance_sampling, {"clip_low": 0.2, "ratio_cap": 0.0})
    check_loss(TrainerCapabilities(), loss, field="train.loss_fn", provider="p")  # any loss
    honoured = TrainerCapabilities(losses={"ppo": frozenset({"clip_low"})})
    check_loss(honoured, loss, field="train.loss_fn", provider="p")  # ratio_cap 0 is off
    capped = NamedLoss("ppo", importance_sampling, {"clip_low": 0.2, "ratio_cap": 2.0})
    with pytest.raises(ConfigError, match=r"cold_start.loss_fn = 'ppo' .*ratio_cap = 2"):
        check_loss(honoured, capped, field="cold_start.loss_fn", provider="p")


def test_require_trainer_names_the_provider() -> None:
    class Only:
        tokenizer = None

        async def sample(self, prompt_tokens, num_samples, params):  # noqa: ANN001, ANN201
            return []

        def close(self) -> None:
            pass

    with pytest.raises(ConfigError, match="model.provider = 'hosted' only samples"):
        require_trainer(Model(sampler=Only()), "hosted")


def test_eval_of_a_checkpoint_needs_a_trainer(tmp_path, run_cli, scripted_plugin):
    config = train_config(tmp_path, "trains = false\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "remote_checkpoint.json").write_text("{}")  # marks a model state folder
    args = ["eval", "--config", str(config), "--data", str(tmp_path / "train.jsonl")]
    result = run_cli(*args, "--run-dir", tmp_path / "run", "--checkpoint", state)
    err = result.err
    assert result.code == 2, err
    assert "model provider 'scripted' only samples" in err, err
    assert not scripted_plugin.created[0].calls
    # The base model needs no trainer.
    base = run_cli(*args, "--run-dir", tmp_path / "base")
    assert base.code == 0, base
    assert scripted_plugin.created[1].calls
