"""``searchr1 config check``: every problem of a file in one run, in file order (core keys,
cross-field rules, plugin names and plugin tables together), and every setting of the chosen plugins with its
default (``--plugins``)."""

from __future__ import annotations

import re

MISTAKES = """\
[model]
provider = "locl"
temprature = 0.5
max_new_tokens = 9000
[rollout]
group_size = 1
[search]
provider = "local"
[search.local]
corpuss = "corpus.jsonl"
[search.bing]
depth = 1
[reward]
name = "format_answr"
terms = ["no_repeats"]
[train]
max_stepz = 3
"""


def test_config_check_reports_every_problem_at_once_in_file_order(config_file, run_cli):
    result = run_cli("config", "check", "--config", config_file(MISTAKES))
    assert result.code == 2
    problems = [line for line in result.err.splitlines() if re.search(r"config\.toml:\d+: ", line)]
    lines = [int(re.search(r"config\.toml:(\d+): ", p).group(1)) for p in problems]
    assert lines == [2, 3, 4, 6, 10, 11, 14, 15, 17], result.err
    expected = [
        "model.provider = 'locl': no model provider of that name is installed; did you mean 'local'?",
        "unknown key 'model.temprature'; did you mean 'temperature'?",
        "model.max_new_tokens (9000) is larger than rollout.max_trajectory_tokens (8192)",
        "rollout.group_size = 1 must be >= 2",
        "unknown key 'search.local.corpuss'; did you mean 'corpus'?",
        "[search.bing]: no installed plugin is called 'bing'",
        "reward.name = 'format_answr': no reward of that name is installed; did you mean 'format_answer'?",
        "reward.terms = 'no_repeats': no reward of that name is installed",
        "unknown key 'train.max_stepz'; did you mean 'max_steps'?",
    ]  # fmt: skip
    for problem, words in zip(problems, expected, strict=True):
        assert words in problem, (words, problem)


def test_config_check_plugins_prints_each_chosen_plugins_settings_with_defaults(
    config_file, run_cli
):
    text = '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    text += '[model]\nbase_model = "builtin:tiny"\n'
    result = run_cli("config", "check", "--plugins", "--config", config_file(text))
    assert result.code == 0, result.err
    out = result.out
    assert "# the chosen plugins' settings: every key, its value here and its default" in out
    section = out[out.index("[search.local]  # search provider 'local'") :]
    assert re.search(
        r'^corpus = "builtin:world/corpus.jsonl"  # set in \S+config\.toml:4', section, re.M
    )
    assert "[model.local]  # model provider 'local' (plugin " in out
    assert "[reward.format_answer]  # reward 'format_answer'" in out
    assert "format_penalty = -0.1  # default" in out
    assert "[train.cold_start]  # the cold start (core)" in out
    assert re.search(r"^steps = 0  # default; supervised steps before RL", out, re.M)
    # without the flag, the core sections only
    plain = run_cli("config", "check", "--config", config_file(text)).out
    assert "[reward.format_answer]" not in plain


def test_config_check_warns_of_the_eval_settings_train_refuses(
    tmp_path, run_cli, scripted_plugin
) -> None:
    """``[train] keep_best`` without ``eval_every``, and ``eval_every`` without ``[data] eval``:
    config check passes (smoke and eval run) with a "train would stop here" warning naming the
    line, and train refuses with the same words (one rule)."""
    from train_configs import train_config

    for line, words in {
        "keep_best = true\n": "train.keep_best = true keeps the checkpoint with the best",
        "eval_every = 2\n": "train.eval_every = 2 needs a held-out QA file: set [data] eval",
    }.items():
        folder = tmp_path / line.split()[0]
        folder.mkdir()
        config = train_config(folder, train=line)
        number = config.read_text().splitlines().index(line.strip()) + 1
        checked = run_cli("config", "check", "--config", config)
        assert checked.code == 0, checked.err
        warning = next(w for w in checked.err.splitlines() if words in w)
        assert warning.startswith(f"searchr1: warning: {config}:{number}: "), warning
        assert warning.endswith("(train would stop here)"), warning
        assert "1 warning says train would stop here" in checked.out
        trained = run_cli("train", "--config", config, "--run-dir", folder / "run")
        assert trained.code == 2, trained.out + trained.err
        rule = warning.removeprefix("searchr1: warning: ").removesuffix(" (train would stop here)")
        assert rule in trained.err, trained.err


def test_config_check_counts_every_warning_that_says_train_would_stop(config_file, run_cli):
    """A missing training file and a missing held-out file are two warnings that say train
    would stop (the held-out one: train and eval); the header counts both, in words that agree
    with the count."""
    text = '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    text += '[data]\ntrain = "data/missing/train.jsonl"\neval = "data/missing/heldout.jsonl"\n'
    result = run_cli("config", "check", "--config", config_file(text))
    assert result.code == 0, result.err
    stops = [line for line in result.err.splitlines() if "would stop here" in line]
    assert len(stops) == 2, result.err
    assert "train and eval would stop here" in stops[1]
    assert "OK for smoke and eval; 2 warnings say train would stop here" in result.out


def test_config_check_says_which_builtin_asset_it_built_why_and_how_long(
    config_file, run_cli, tmp_path, monkeypatch
):
    """In an empty cache folder, the built-in world and model the config names are built on
    first use: stderr says so before each build (what, why, about how long), the check's notes
    say what it built and where; a second check builds nothing and says nothing of it."""
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("SEARCHR1_CACHE", str(cache))
    text = '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    text += '[model]\nbase_model = "builtin:tiny"\n[data]\ntrain = "builtin:world/train.jsonl"\n'
    first = run_cli("config", "check", "--config", config_file(text))
    assert first.code == 0, first.err
    said = [line for line in first.err.splitlines() if line.startswith("searchr1: building")]
    assert len(said) == 2 and "builtin:tiny (first use" in "".join(said), said
    said = [line for line in said if "builtin:world" in line]
    assert said == [
        f"searchr1: building builtin:world (first use: not yet in {cache}); it takes under a "
        f"second; 1 MB; later commands reuse it"
    ]
    notes = [line for line in first.out.splitlines() if line.startswith("# built ")]
    assert len(notes) == 2, first.out
    (note,) = [line for line in notes if "builtin:world" in line]
    assert re.fullmatch(
        rf"# built builtin:world in \d+ s \(first use: not yet in {re.escape(str(cache))}\): "
        rf"{re.escape(str(cache / 'world-1'))}; later commands reuse it",
        note,
    ), note
    again = run_cli("config", "check", "--config", config_file(text))
    assert again.code == 0 and "build" not in again.err, again.err
    assert "# built " not in again.out
