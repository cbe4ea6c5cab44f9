"""``bench/recipes.py --table``: the recipe table from saved runs, and which differences it
calls beyond the seed spread (the two recipes' ranges over seeds do not overlap)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _row(recipe: str, seed: int, em: float, one_hop: float) -> dict:
    per = {
        "hard_1hop": {"em": one_hop, "f1": one_hop},
        "hard_2hop": {"em": em, "f1": min(1.0, em + 0.1)},
    }
    stages = {"rl": {"em": em, "f1": min(1.0, em + 0.1), "per_source": per}}
    return {"recipe": recipe, "overrides": [], "result": {"seed": seed, "stages": stages}}


def test_the_table_says_which_differences_beat_the_seed_spread(tmp_path: Path) -> None:
    rows = [
        _row("default", 0, 0.50, 0.90),
        _row("no-kl", 0, 0.30, 0.85),
        _row("f1-reward", 0, 0.45, 0.95),
        _row("default", 1, 0.60, 0.80),
        _row("no-kl", 1, 0.35, 0.90),
        _row("f1-reward", 1, 0.70, 0.90),
    ]
    saved = tmp_path / "recipes.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recipes.py"), "--table", str(saved)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = {line.split("|")[1].strip(): line for line in out.splitlines() if line.count("|") > 2}
    # mean (spread) over the two seeds, overall and per source, in the runs' order
    assert "| default | 0,1 | 55.0 (10.0) | 65.0 (10.0) | 85.0 (10.0) / 85.0 (10.0) |" in out
    assert list(lines)[:5] == ["recipe", "---", "default", "no-kl", "f1-reward"]
    # no-kl's EM range [30, 35] lies below default's [50, 60]; one-hop ranges overlap
    assert lines["no-kl"].endswith("| -22.5 | em, em/hard_2hop |")
    # f1-reward's [45, 70] overlaps default's: within the seed spread
    assert lines["f1-reward"].endswith("| +2.5 | none |")


def test_every_named_recipe_is_a_config_train_accepts(tmp_path: Path) -> None:
    """Each recipe of each named set, applied to the harder world's example the way the bench
    writes it, passes the checks ``train`` runs before it starts (a typo in a key, a value or a
    loss option would cost an hour-long bench run)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import real_model
    import recipes

    from searchr1.core.config import load_config
    from searchr1.core.plugins import load_registry
    from searchr1.core.trainer_checks import loss_refusals

    registry = load_registry()
    example = ROOT / "examples" / "real-model-hard.toml"
    for set_name, named in recipes.RECIPE_SETS.items():
        for name, overrides in named.items():
            args = real_model.build_parser().parse_args(
                ["--config", str(example), "--eval-questions", "8"]
                + [f"--set={item}" for item in overrides]
            )
            path = real_model.write_config(args, 0, tmp_path / set_name / name)
            config = load_config(path, registry=registry, check_plugins=True)
            assert loss_refusals(config, registry) == [], (set_name, name)
            written = tomllib.loads(path.read_text())
            for item in overrides:  # each override reached the config
                dotted, _, value = item.partition("=")
                *sections, key = dotted.split(".")
                table = written
                for section in sections:
                    table = table[section]
                assert table[key] == tomllib.loads(f"v = {value}")["v"], (set_name, item)


def _run_folder(path: Path, *, pinned: bool) -> Path:
    """A run folder's events as ``train`` writes them through step 1 (KL reference pinned or
    not), with checkpoints 0 and 1 and the eval records of each stage."""
    events = [
        {"event": "run_start"},
        {"event": "eval/heldout_em", "step": 0, "when": "before"},
        {"event": "cold_start_done", "steps": 2, "kept": 8},
        {"event": "eval/heldout_em", "step": 0, "when": "cold_start"},
        *([{"event": "kl_reference"}] if pinned else []),
        {"event": "checkpoint", "step": 0},
        {"event": "eval/heldout_em", "step": 0, "when": "step_0"},
        {"event": "metrics", "step": 1},
        {"event": "checkpoint", "step": 1},
        {"event": "eval/heldout_em", "step": 1, "when": "after"},
    ]
    path.mkdir(parents=True)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for step in (0, 1):  # what the checkpoint reader needs of a model-only checkpoint
        (path / "checkpoints" / f"step_{step:06d}" / "model").mkdir(parents=True)
        (path / "checkpoints" / f"step_{step:06d}" / "trainer.json").write_text(
            json.dumps({"step": step, "files": {}})
        )
    for when in ("before", "cold_start", "step_0", "after"):
        (path / f"eval_heldout_{when}.jsonl").write_text("{}\n")
    return path


def test_a_recipe_starts_from_the_first_ones_cold_start_only_when_rl_alone_differs(
    tmp_path: Path,
) -> None:
    """``--share-cold-start``: which recipes of the named sets may begin RL from the first
    recipe's cold start (their written configs differ only in what RL reads), and the folder
    ``train --resume`` continues from."""
    sys.path.insert(0, str(ROOT / "bench"))
    import real_model
    import recipes

    example = str(ROOT / "examples" / "real-model-hard.toml")

    def written(folder: str, overrides: list[str], questions: int = 8) -> Path:
        args = real_model.build_parser().parse_args(
            ["--config", example, "--eval-questions", str(questions)]
            + [f"--set={item}" for item in overrides]
        )
        return real_model.write_config(args, 0, tmp_path / folder)

    def first_run(folder: str, overrides: list[str], *, pinned: bool) -> Path:
        written(folder, overrides)
        return _run_folder(tmp_path / folder / "runs" / "train-1", pinned=pinned)

    for set_name in ("estimators", "collapse", "search-price"):
        named = list(recipes.RECIPE_SETS[set_name].items())
        kl = set_name != "search-price"  # that set's first recipe has no KL term: none pinned
        owner = first_run(f"{set_name}-first", named[0][1], pinned=kl)
        for name, overrides in named[1:]:
            config = written(f"{set_name}-{name}", overrides)
            assert recipes.cold_start_differs(config, owner) is None, (set_name, name)
    example_run = first_run("example", [], pinned=True)
    # the cold start reads its own settings and the model's: such a recipe runs its own
    config = written("cs-lr", ["train.cold_start.lr=1e-2", 'reward.name="f1"'])
    why = recipes.cold_start_differs(config, example_run)
    assert why == "it sets train.cold_start.lr otherwise, which the cold start reads"
    # other held-out questions: the copied evals "before" and "cold_start" would not be its own
    why = recipes.cold_start_differs(written("more-eval", [], questions=16), example_run)
    assert why is not None and "--eval-questions" in why
    # a KL term needs the reference the first run pins only when its own KL term is on
    no_kl = first_run("no-kl", ["train.loss.kl_coef=0.0"], pinned=False)
    why = recipes.cold_start_differs(written("kl-on", []), no_kl)
    assert why is not None and "KL" in why
    assert recipes.cold_start_differs(written("kl-off", ["train.loss.kl_coef=0.0"]), no_kl) is None

    copy = real_model.cold_started_copy(example_run, tmp_path / "copies")
    assert [p.name for p in (copy / "checkpoints").iterdir()] == ["step_000000"]
    kept = [json.loads(line) for line in (copy / "events.jsonl").read_text().splitlines()]
    assert [e.get("when") or e["event"] for e in kept][-4:] == [
        "cold_start",
        "kl_reference",
        "checkpoint",
        "step_0",
    ]
    assert not (copy / "eval_heldout_after.jsonl").exists()
    assert (copy / "eval_heldout_cold_start.jsonl").is_file()


def test_the_same_command_again_runs_only_what_a_cut_run_left(tmp_path: Path) -> None:
    """A rerun with the same ``--out`` keeps the runs ``recipes.jsonl`` holds (here all of
    them, so it trains nothing and prints their table); a recipe saved under the same name
    with other overrides is refused, naming it."""
    rows = [
        {**_row(name, seed, em, 0.9), "overrides": overrides}
        for seed in (0, 1)
        for name, overrides, em in (
            ("default", [], 0.5 + seed / 10),
            ("no-kl", ["train.loss.kl_coef=0.0"], 0.3),
        )
    ]
    for row in rows:
        row["result"]["run_dir"] = str(tmp_path / "runs" / row["recipe"])
    (tmp_path / "recipes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, str(ROOT / "bench" / "recipes.py"), "--out", str(tmp_path)]
    command += ["--seeds", "0,1", "--recipe", "default=", "--share-cold-start"]
    done = subprocess.run(
        [*command, "--recipe", "no-kl=train.loss.kl_coef=0.0"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "| no-kl | 0,1 | 30.0 (0.0) |" in done.stdout
    assert done.stderr.count("finished earlier") == 4
    other = subprocess.run(
        [*command, "--recipe", "no-kl=optimizer.lr=2e-4"], capture_output=True, text=True
    )
    assert other.returncode != 0
    assert "recipe 'no-kl' ran with ['train.loss.kl_coef=0.0']" in other.stderr
