"""``searchr1 config check`` runs the checks ``train`` runs before its model loads: the same
function, so the same words, with the file and line.

What stops every command (a model, corpus or index that is not there, ``[lora]
target_modules`` the model lacks) is an error (exit 2) in both; what stops ``train`` alone (a
KL term the chosen provider cannot score) is a ``train would stop here`` warning in config
check, since smoke and eval run anyway, and train's error. Each case runs the CLI in-process;
none loads a model's weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import make_config

ROOT = Path(__file__).resolve().parents[2]


def _line(config: Path, text: str) -> int:
    """The 1-based line of ``config`` that starts with ``text``."""
    lines = config.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(text))


@pytest.mark.parametrize(
    ("changes", "line", "words"),
    [
        (
            {"lora": {"target_modules": ["qproj"]}},
            "target_modules",
            "lora.target_modules: ['qproj'] not found in 'builtin:tiny'; linear layers there "
            "include: ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', "
            "'v_proj']",
        ),
        (
            {"model": {"base_model": "builtin:tinyy"}},
            "base_model",
            "model.base_model = 'builtin:tinyy': unknown built-in asset 'builtin:tinyy'; known:",
        ),
        (
            {"search": {"local": None}},  # [search] without its [search.local] table
            "[search]",
            "search.local.corpus is not set: the local provider needs a JSONL corpus",
        ),
        (
            {"search": {"provider": "dense", "local": None, "dense": {"index": "idx/none"}}},
            "index",
            "search.dense.index = 'idx/none': idx/none: not a finished dense index, no card.json",
        ),
    ],
    ids=["target_modules", "builtin_model", "no_corpus", "no_dense_index"],
)
def test_config_check_refuses_what_stops_train_with_the_line(
    tmp_path: Path, monkeypatch, config_file, run_cli, changes, line, words
) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_file(make_config(**changes))
    checked = run_cli("config", "check", "--config", config)
    assert checked.code == 2, checked.out + checked.err
    (problem,) = [p for p in checked.err.splitlines() if words in p]
    assert problem.startswith(f"searchr1: error: {config}:{_line(config, line)}: "), problem
    trained = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert trained.code == 2, trained.out + trained.err
    assert problem in trained.err.splitlines()  # the same check, the same words
    assert "Traceback" not in trained.err and not (tmp_path / "run").exists()


def test_a_kl_term_the_provider_cannot_score_is_named_before_train_logs_in(
    tmp_path: Path, monkeypatch, config_file, run_cli
) -> None:
    """``[train.loss] kl_coef`` with a remote provider: config check warns with the line
    (smoke and eval run); train refuses with the same words before any login (its address is
    a closed loopback port, which a login would report instead)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-test-0123456789")
    model = {"provider": "taotoken", "api_base": "http://127.0.0.1:9/api"}
    model |= {"api_key": "${TAOTOKEN_API_KEY}"}
    config = config_file(make_config(model=model, train={"loss": {"kl_coef": 0.01}}))
    checked = run_cli("config", "check", "--config", config)
    assert checked.code == 0, checked.err
    assert "OK for smoke and eval; 1 warning says train would stop here" in checked.out
    (warning,) = [w for w in checked.err.splitlines() if "kl_coef" in w]
    where = f"{config}:{_line(config, 'kl_coef')}"
    assert warning.startswith(f"searchr1: warning: {where}: train.loss.kl_coef = 0.01: "), warning
    assert "model.provider = 'taotoken' cannot score the reference policy" in warning
    assert warning.endswith(" (train would stop here)")
    trained = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert trained.code == 2, trained.out + trained.err
    rule = warning.removeprefix("searchr1: warning: ").removesuffix(" (train would stop here)")
    assert f"searchr1: error: {rule}" in trained.err.splitlines(), trained.err
    assert "127.0.0.1:9" not in trained.err  # no login was tried


@pytest.mark.parametrize(
    ("train", "line", "words"),
    [
        (
            {"loss_agg_mode": "token_mean"},
            "loss_agg_mode",
            "train.loss_agg_mode = 'token_mean' is not one of 'seq-mean-token-sum', "
            "'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'",
        ),
        (
            {"advantage_estimator": "reinforce"},
            "advantage_estimator",
            "train.advantage_estimator = 'reinforce' is not one of 'grpo', 'rloo'",
        ),
        (
            {"advantage_estimator": "rloo", "scale_rewards": "group"},
            "scale_rewards",
            "train.scale_rewards divides grpo's advantages by a reward std, but "
            "train.advantage_estimator = 'rloo' has its own scale",
        ),
        (
            {"loss": {"importance_sampling_level": "seq"}},
            "importance_sampling_level",
            "train.loss.importance_sampling_level = 'seq' is not one of 'token', 'sequence'",
        ),
    ],
    ids=["loss_agg_mode", "estimator", "scale_rewards_rloo", "importance_sampling_level"],
)
def test_a_bad_estimator_or_aggregation_setting_is_named_with_its_line(
    tmp_path: Path, monkeypatch, config_file, run_cli, train, line, words
) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_file(make_config(train=train))
    checked = run_cli("config", "check", "--config", config)
    assert checked.code == 2, checked.out + checked.err
    (problem,) = [p for p in checked.err.splitlines() if words in p]
    assert problem.startswith(f"searchr1: error: {config}:{_line(config, line)}: "), problem


def test_a_sequence_ratio_the_remote_service_cannot_compute_is_named_before_train_logs_in(
    tmp_path: Path, monkeypatch, config_file, run_cli
) -> None:
    """GSPO's ratio (``[train.loss] importance_sampling_level = "sequence"``) with a service
    that computes the loss itself: config check warns naming the setting and its line, train
    refuses with the same words before any login. (The aggregation and the estimators work
    there: advantages are the core's, a datum's weight travels in its advantages.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-test-0123456789")
    model = {"provider": "taotoken", "api_base": "http://127.0.0.1:9/api"}
    model |= {"api_key": "${TAOTOKEN_API_KEY}"}
    train = {"loss_fn": "ppo", "loss_agg_mode": "token-mean", "advantage_estimator": "rloo"}
    train["loss"] = {"importance_sampling_level": "sequence"}
    config = config_file(make_config(model=model, train=train))
    checked = run_cli("config", "check", "--config", config)
    assert checked.code == 0, checked.err
    (warning,) = [w for w in checked.err.splitlines() if "importance_sampling_level" in w]
    where = f"{config}:{_line(config, 'importance_sampling_level')}"
    assert warning.startswith(
        f"searchr1: warning: {where}: train.loss_fn = 'ppo' is built with "
        f"importance_sampling_level = \"sequence\", which model.provider = 'taotoken' does "
        f"not honour"
    ), warning
    assert "set importance_sampling_level to its default" in warning
    assert not [w for w in checked.err.splitlines() if "loss_agg_mode" in w]
    trained = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert trained.code == 2, trained.out + trained.err
    rule = warning.removeprefix("searchr1: warning: ").removesuffix(" (train would stop here)")
    assert f"searchr1: error: {rule}" in trained.err.splitlines(), trained.err
    assert "127.0.0.1:9" not in trained.err
