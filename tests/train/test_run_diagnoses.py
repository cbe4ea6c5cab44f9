"""What a run tells its user about its own limits: a step that trains no token, turns and
trajectories cut by a token setting, LoRA targets that leave whole layer types out, a first
turn that cannot fit the token settings. Through the CLI (train, report, config check) on real
parts: the scripted provider only where every group must be degenerate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from arch_models import build_family
from cli_run import read_events, write_config

from searchr1.core.plugins import load_registry


@pytest.mark.parametrize("kl", [False, True], ids=["policy-only", "kl-term"])
def test_steps_that_train_no_token_and_cut_turns_are_warned_once_and_counted(
    tmp_path: Path, config_file, run_cli, scripted_plugin, kl: bool
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}?", "golden_answers": ["yes"]}) + "\n" for i in range(8)
        )
    )
    config = config_file(
        f'[run]\ndir = "{tmp_path / "runs"}"\n'
        '[model]\nprovider = "scripted"\nmax_new_tokens = 4\n'
        '[model.scripted]\nturns = [["<answer> no no no no </answer>"], ["<answer> nope nope </answer>"]]\n'
        + ("kl_reference = true\n" if kl else "")
        + '[rollout]\nprotocol = "tags"\nquestions_per_batch = 1\ngroup_size = 2\n'
        "max_trajectory_tokens = 512\n"
        "[train]\nmax_steps = 3\nsave_every = 10\nmax_datum_tokens = 512\n"
        "max_micro_batch_tokens = 4096\n"
        f'[data]\ntrain = "{data}"\n'
        '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
        + ("[train.loss]\nkl_coef = 0.1\n" if kl else "")
    )
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", config, "--run-dir", run_dir).code == 0
    events = read_events(run_dir)
    alerts = [e for e in events if e["event"] == "health_alert"]
    # once each, not once per step: every turn is cut at max_new_tokens = 4, so every
    # trajectory gets -0.1 and every group is degenerate
    assert [a["kind"] for a in alerts] == ["no_tokens_trained", "max_new_tokens"]
    assert alerts[0]["step"] == 1 and alerts[0]["level"] == "warning"
    assert alerts[1]["message"].startswith(
        "step 1: 2 of 2 turns ended at model.max_new_tokens = 4 before the protocol's closing "
        "tag (stop reason 'length')"
    )
    # a KL term still trains the degenerate groups' 2 x 4 sampled tokens: the warning says so
    subject, effect = (
        (
            "step 1's policy term",
            "only the KL term ([train.loss] kl_coef, 8 tokens) moved the weights, toward the "
            "reference policy",
        )
        if kl
        else ("step 1", "the update changed nothing")
    )
    assert alerts[0]["message"].startswith(
        f"{subject} trained no token: all 1 of its groups "
        "were degenerate (every trajectory of a group got the same reward, so every advantage "
        f"is 0) and {effect}. No trajectory answered in the protocol's format, so the reward "
        "could not vary: more samples would get the same penalty. Raise model.max_new_tokens "
        "(= 4): turns ended at it before their closing tag"
    )
    (done,) = [e for e in events if e["event"] == "train_done"]
    assert done["steps_without_training"] == 3 and done["turns_cut_at_max_new_tokens"] == 6
    assert run_cli("report", run_dir).code == 0
    page = (run_dir / "report" / "index.html").read_text()
    subject = "steps' policy term" if kl else "steps"
    assert f"3 of 3 {subject} trained no token (steps 1, 2, 3)" in page
    assert ("the KL term alone moved their weights" in page) == kl
    assert "no_tokens_trained" in page


@pytest.fixture(scope="module")
def qwen3_5_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3.5 (3 linear-attention layers, 1 full-attention layer) with the
    official Qwen3.5 chat template on its tokenizer."""
    from transformers import AutoTokenizer

    folder = build_family("qwen3_5", tmp_path_factory.mktemp("qwen3_5"))
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = (Path(__file__).parents[1] / "chat_templates" / "qwen3_5.jinja").read_text()
    tok.save_pretrained(folder)
    return folder


def _offline_with(tmp_path: Path, **replace: str) -> Path:
    from importlib.resources import files

    text = files("searchr1.defaults").joinpath("offline.toml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return write_config(tmp_path, text)


def test_config_check_warns_when_lora_targets_leave_layer_types_out(
    tmp_path: Path, run_cli, qwen3_5_folder: Path
) -> None:
    seed_targets = '["q_proj", "k_proj", "v_proj", "o_proj"]'
    config = _offline_with(
        tmp_path,
        **{
            '"builtin:tiny"': f'"{qwen3_5_folder}"',
            '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]': (
                seed_targets
            ),
        },
    )
    check = run_cli("config", "check", "--config", config)
    assert check.code == 0  # a warning, not an error
    out = check.out
    assert (
        "# warning: lora.target_modules = ['q_proj', 'k_proj', 'v_proj', 'o_proj'] adapts no "
        f"module of the linear_attention layers of '{qwen3_5_folder}' (3 of its 4 layers, whose "
        "own linear modules are linear_attn.out_proj, linear_attn.in_proj_qkv, "
        "linear_attn.in_proj_z, linear_attn.in_proj_b, linear_attn.in_proj_a); only "
        "full_attention: 1 of 1 layers (q_proj, k_proj, v_proj, o_proj) learn. Set "
        "target_modules = \"all-linear\" to adapt every linear layer, or add 'out_proj', "
        "'in_proj_qkv', 'in_proj_z', 'in_proj_b', 'in_proj_a' to the list"
    ) in out
    # smoke (and train, through the same announce_config) print it before the run
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    out = smoke.err  # smoke's report (stdout: JSON events)
    assert smoke.code in (0, 3), out
    assert (
        "warning: lora.target_modules = ['q_proj', 'k_proj', 'v_proj', 'o_proj'] adapts no " in out
    )
    config.write_text(config.read_text().replace(seed_targets, '"all-linear"'))
    check = run_cli("config", "check", "--config", config)
    assert check.code == 0 and "adapts no module" not in check.out


def test_the_model_load_logs_which_layer_types_lora_covers(
    tmp_path: Path, qwen3_5_folder: Path
) -> None:
    from searchr1.core.config import load_config
    from searchr1.core.logs import setup_logging
    from searchr1.plugins.local_model.provider import LocalModelProvider

    config = load_config(
        str(_offline_with(tmp_path, **{'"builtin:tiny"': f'"{qwen3_5_folder}"'})),
        registry=load_registry(),
    ).replace(lora={"target_modules": ("q_proj", "k_proj", "v_proj", "o_proj")})
    setup_logging("r", tmp_path / "events.jsonl")
    LocalModelProvider.from_config(config).close()
    (line,) = read_events(tmp_path, "lora_coverage")
    assert line["message"] == (
        "LoRA adapter over 4 layers: linear_attention: none of its 3 layers; full_attention: "
        "1 of 1 layers (q_proj, k_proj, v_proj, o_proj)"
    )


def test_config_check_warns_when_one_turn_cannot_fit_the_token_settings(
    tmp_path: Path, run_cli, qwen3_5_folder: Path
) -> None:
    """The issue's case: the offline example on a Qwen3.5 chat template (tool_calls): the
    tools prompt fills most of max_trajectory_tokens, and one XML search call is longer than
    max_new_tokens = 24."""
    config = _offline_with(
        tmp_path,
        **{
            '"builtin:tiny"': f'"{qwen3_5_folder}"',
            'protocol = "tags"': 'protocol = "tool_calls"',
        },
    )
    check = run_cli("config", "check", "--config", config)
    assert check.code == 0
    out = check.out
    warning = next(x for x in out.splitlines() if "model.max_new_tokens = 24 is shorter" in x)
    assert warning.startswith(
        "# warning: model.max_new_tokens = 24 is shorter than one well-formed search turn ("
    )
    assert "tokens, tool_calls protocol, question '" in warning
    assert "raise model.max_new_tokens to at least" in warning
    config.write_text(
        config.read_text().replace("max_trajectory_tokens = 448", "max_trajectory_tokens = 100")
    )
    config.write_text(config.read_text().replace("max_datum_tokens = 448", "max_datum_tokens = 99"))
    check = run_cli("config", "check", "--config", config)
    assert check.code == 0
    out = check.out
    assert "# warning: rollout.max_trajectory_tokens = 100 cannot hold the first prompt (" in out
