"""Training recipes side by side: which differences beat the seed spread.

A recipe is a name and a set of ``--set SECTION.KEY=VALUE`` overrides of one config; each
recipe runs ``bench/real_model.py``'s measurement (base -> cold start -> RL, one ``searchr1
train`` a seed) on the same seeds and held-out questions. Each run's JSON line is appended to
``OUT/recipes.jsonl`` as it ends (a cut run keeps what finished, ``--table`` reprints it, and
the same command again runs only what is missing).
The table: per recipe, the held-out EM and F1 after RL, overall and per ``data_source``, as
mean (spread = max - min over seeds); then, for each recipe against the first, the EM
difference per type and whether it is beyond the seed spread (the two recipes' ranges over
seeds do not overlap). Without ``--recipe``, a named set (``--recipes``, ``RECIPE_SETS``):
``basics`` (the default, the F1 reward, no KL term), ``estimators``, ``search-price``,
``f1-length``, ``collapse``. ``--share-cold-start``: per seed, the first recipe's run does the
cold start and every later recipe that differs from it only in what RL reads (``RL_ONLY``)
resumes from its checkpoint 0, so the recipes begin RL from one adapter and each saves the
cold start and its evals (a quarter of a 160-question run on this machine)::

    python bench/recipes.py --config examples/real-model-hard.toml --seeds 0,1,2
    python bench/recipes.py --config examples/real-model-hard.toml --recipes estimators \
        --share-cold-start --eval-questions 160 --threads 1
    python bench/recipes.py --recipe default= --recipe 'lr2e-4=optimizer.lr=2e-4' --seeds 0,1
    python bench/recipes.py --table OUT/recipes.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_model  # noqa: E402  (bench/ is not a package)

from searchr1.core.checkpoint import dotted_leaves  # noqa: E402
from searchr1.core.logs import read_jsonl  # noqa: E402

_NO_KL = ["train.loss.kl_coef=0.0"]
_GATED = ["reward.search_cost.only_when_correct=true"]
_DSM = ['rollout.dynamic_sampling_metric="correct"']
_COST_GATED = [*_NO_KL, 'reward.terms=["search_cost"]', *_GATED]
_COST_GATED_DSM = [*_COST_GATED, *_DSM]
_GSPO = [
    'train.loss_fn="ppo"',
    'train.loss.importance_sampling_level="sequence"',
    'train.loss_agg_mode="seq-mean-token-mean"',
]
_SEARCH_TERMS = 'reward.terms=["retrieval_credit", "search_cost"]'
_LR2_PRICE3 = ["optimizer.lr=2e-4", "reward.search_cost.cost_per_search=0.15"]

#: named sets of recipes (``--recipes NAME``), each recipe a name -> its overrides; the first
#: recipe of a set is the baseline the others are compared with
RECIPE_SETS: dict[str, dict[str, list[str]]] = {
    # the example (EM reward, KL 0.1), the F1 reward, no KL term
    "basics": {
        "default": [],
        "f1-reward": ['reward.name="f1"'],
        "no-kl": _NO_KL,
    },
    # the estimators and aggregations users port from verl and TRL (docs/training.md)
    "estimators": {
        "default": [],
        "rloo": ['train.advantage_estimator="rloo"'],
        "dr-grpo": ['train.loss_agg_mode="seq-mean-token-sum-norm"'],
        "dapo": ['train.loss_agg_mode="token-mean"'],
        "gspo": _GSPO,
        "search-terms": [_SEARCH_TERMS],
    },
    # the same without the KL term, as DAPO and Dr. GRPO train: a seed took 49-56 min here
    # from a shared cold start against about 80 with the term (docs/benchmarks.md)
    "estimators-no-kl": {
        "no-kl": _NO_KL,
        "rloo-no-kl": [*_NO_KL, 'train.advantage_estimator="rloo"'],
        "dr-grpo-no-kl": [*_NO_KL, 'train.loss_agg_mode="seq-mean-token-sum-norm"'],
        "dapo-no-kl": [*_NO_KL, 'train.loss_agg_mode="token-mean"'],
        "gspo-no-kl": [*_NO_KL, *_GSPO],
        "search-terms-no-kl": [*_NO_KL, _SEARCH_TERMS],
    },
    # pricing searches against over-searching, without the KL term (docs/rewards.md): every
    # search, right answers' only, and with dynamic sampling judged on exact match (at the
    # example's learning rate, 2x and 3x, and at 2x with 3x the default price)
    "search-price": {
        "no-kl": _NO_KL,
        "cost": [*_NO_KL, 'reward.terms=["search_cost"]'],
        "cost-gated": _COST_GATED,
        "cost-gated-dsm": _COST_GATED_DSM,
        "cost-gated-dsm-lr2e-4": [*_COST_GATED_DSM, "optimizer.lr=2e-4"],
        "cost-gated-dsm-lr3e-4": [*_COST_GATED_DSM, "optimizer.lr=3e-4"],
        "cost0.15-gated-dsm-lr2e-4": [*_COST_GATED_DSM, *_LR2_PRICE3],
        # credit for retrieving the answer, so a second search that finds it pays even when
        # the answer is wrong: against that price's cost on two-hop questions
        "credit-cost0.15-gated-dsm-lr2e-4": [
            *_NO_KL,
            _SEARCH_TERMS,
            *_GATED,
            *_DSM,
            *_LR2_PRICE3,
        ],
        # the same with twice the questions a step (8 x 4): a steadier gradient per update
        "credit-cost0.15-gated-dsm-lr2e-4-q8": [
            *_NO_KL,
            _SEARCH_TERMS,
            *_GATED,
            *_DSM,
            *_LR2_PRICE3,
            "rollout.questions_per_batch=8",
        ],
    },
    # the F1 reward with and without the answer-length term (F1 answer padding)
    "f1-length": {
        "f1": ['reward.name="f1"'],
        "f1-length": ['reward.name="f1"', 'reward.terms=["answer_length_penalty"]'],
    },
    # a provoked collapse: the learning rate 10x the example's, evaluated every 2 steps so the
    # held-out EM's fall can be placed against the likelihood-displacement alarm
    "collapse": {
        "default": ["train.eval_every=2"],
        "lr-10x": ["optimizer.lr=1e-3", "train.eval_every=2"],
    },
}


#: the settings only RL reads (dotted-key prefixes): a recipe that differs from the first only
#: in these can start RL from the first recipe's cold start (``--share-cold-start``). The cold
#: start reads the reward too, but only to keep the teacher's trajectories scored above 0:
#: the ideal agent's answers are all right, so the built-in rewards and terms keep them all.
RL_ONLY = (
    "train.loss.",
    "train.loss_fn",
    "train.loss_agg_",
    "train.advantage_",
    "train.scale_",
    "train.mask_truncated_completions",
    "train.eval_every",
    "optimizer.lr",
    "rollout.dynamic_sampling",
    "rollout.questions_per_batch",
    "reward.",
)


def cold_start_differs(config: Path, first_run: Path) -> str | None:
    """Why the bench config ``config`` cannot begin RL from the cold start of the run folder
    ``first_run`` (a bench run: its config is ``first_run/../../config.toml``); None when
    it can: the two configs differ only in ``RL_ONLY`` settings, hold out the same questions,
    and a KL term on finds the reference pinned."""
    mine, theirs = (
        dotted_leaves(tomllib.loads(path.read_text()))
        for path in (config, first_run.parents[1] / "config.toml")
    )
    changed = [
        k
        for k in sorted(mine.keys() | theirs.keys())
        if k not in ("run.dir", "data.eval") and mine.get(k) != theirs.get(k)
    ]
    if other := [k for k in changed if not k.startswith(RL_ONLY)]:
        return f"it sets {', '.join(other)} otherwise, which the cold start reads"
    if Path(str(mine["data.eval"])).read_bytes() != Path(str(theirs["data.eval"])).read_bytes():
        return "it holds out other questions (--eval-questions), so its evals differ"
    events = read_jsonl(first_run / "events.jsonl")[0]
    pinned = any(e.get("event") == "kl_reference" for e in events)
    if not pinned and float(mine.get("train.loss.kl_coef", 0.0)) > 0:  # type: ignore[arg-type]
        return f"its KL term needs the reference {first_run} did not pin (its kl_coef is 0)"
    return None


def earlier_runs(saved: Path, recipes: dict[str, list[str]]) -> dict[tuple[str, int], dict]:
    """The runs ``saved`` (an ``OUT/recipes.jsonl``) already holds, by (recipe, seed): a rerun
    with the same ``--out`` continues a cut one. A recipe saved with other overrides than
    ``recipes`` gives it is refused (its rows would mix two recipes)."""
    rows = read_jsonl(saved)[0] if saved.is_file() else []
    for row in rows:
        if row["recipe"] in recipes and row["overrides"] != recipes[row["recipe"]]:
            raise SystemExit(
                f"{saved}: recipe {row['recipe']!r} ran with {row['overrides']}, not "
                f"{recipes[row['recipe']]}: give another --out, or another name"
            )
    return {(row["recipe"], row["result"]["seed"]): row for row in rows}


def parse_recipe(text: str) -> tuple[str, list[str]]:
    """``NAME=KEY=VALUE[;KEY=VALUE...]`` (``NAME=`` alone: the config as it is)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--recipe {text!r}: expected NAME=SECTION.KEY=VALUE[;...] or NAME=")
    return name, [item.strip() for item in rest.split(";") if item.strip()]


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per recipe (first-seen order): the seeds, and each metric's per-seed values after RL
    (``em``, ``f1`` and ``em/<source>``, ``f1/<source>``)."""
    out: dict[str, dict] = {}
    for row in rows:
        rl = row["result"]["stages"].get("rl")
        if rl is None:
            continue
        entry = out.setdefault(row["recipe"], {"seeds": [], "values": {}})
        entry["seeds"].append(row["result"]["seed"])
        values = {"em": rl["em"], "f1": rl["f1"]}
        for source, m in rl["per_source"].items():
            values[f"em/{source}"], values[f"f1/{source}"] = m["em"], m["f1"]
        for key, value in values.items():
            entry["values"].setdefault(key, []).append(value)
    return out


def _cell(values: list[float]) -> str:
    mean = 100 * sum(values) / len(values)
    return f"{mean:.1f} ({100 * (max(values) - min(values)):.1f})"


def beyond_spread(a: list[float], b: list[float]) -> bool:
    """True when the two recipes' ranges over seeds do not overlap."""
    return max(a) < min(b) or max(b) < min(a)


def table(summary: dict[str, dict]) -> str:
    """The two Markdown tables: scores per recipe, then each recipe against the first."""
    if not summary:
        return "(no finished run)"
    sources = sorted(
        {k.split("/", 1)[1] for entry in summary.values() for k in entry["values"] if "/" in k}
    )
    head = ["recipe", "seeds", "EM", "F1", *(f"{s} EM / F1" for s in sources)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in summary.items():
        v = entry["values"]
        cells = [name, ",".join(map(str, entry["seeds"])), _cell(v["em"]), _cell(v["f1"])]
        cells += [f"{_cell(v[f'em/{s}'])} / {_cell(v[f'f1/{s}'])}" for s in sources]
        lines.append("| " + " | ".join(cells) + " |")
    names = list(summary)
    base = summary[names[0]]["values"]
    lines += ["", f"| recipe vs {names[0]} | EM difference (points) | beyond the seed spread |"]
    lines.append("|---|---|---|")
    for name in names[1:]:
        v = summary[name]["values"]
        diff = 100 * (sum(v["em"]) / len(v["em"]) - sum(base["em"]) / len(base["em"]))
        apart = [s for s in ("em", *(f"em/{s}" for s in sources)) if beyond_spread(v[s], base[s])]
        lines.append(f"| {name} | {diff:+.1f} | {', '.join(apart) or 'none'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(real_model.CONFIG))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="NAME=SECTION.KEY=VALUE[;...]",
        help="a recipe (repeatable; the first is the baseline); default: the --recipes set",
    )
    parser.add_argument(
        "--recipes",
        choices=RECIPE_SETS,
        default="basics",
        help="a named set of recipes when no --recipe is given (default: %(default)s)",
    )
    parser.add_argument(
        "--share-cold-start",
        action="store_true",
        help="each recipe after the first begins RL from the first recipe's cold start of the "
        "seed (train --resume from its checkpoint 0) when they differ only in RL_ONLY settings",
    )
    parser.add_argument(
        "--only", help="comma list: run only these recipes of the set (the rest keep their order)"
    )
    parser.add_argument(
        "--cold-start-from",
        type=Path,
        action="append",
        default=[],
        metavar="RUN_DIR",
        help="a bench run folder (OUT/RECIPE/seed_N/runs/train-...) whose cold start every "
        "recipe of its seed begins RL from, as with --share-cold-start (repeatable)",
    )
    parser.add_argument("--out", type=Path, help="folder of the runs and recipes.jsonl")
    parser.add_argument("--table", type=Path, help="print the table of a recipes.jsonl and exit")
    args, passthrough = parser.parse_known_args()
    if args.table:
        print(table(summarize(read_jsonl(args.table)[0])))
        return 0
    recipes = dict(map(parse_recipe, args.recipe)) if args.recipe else RECIPE_SETS[args.recipes]
    if args.only:
        wanted = args.only.split(",")
        if unknown := [name for name in wanted if name not in recipes]:
            raise SystemExit(
                f"--only: no recipe {', '.join(unknown)} (there are {', '.join(recipes)})"
            )
        recipes = {name: o for name, o in recipes.items() if name in wanted}
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.out or tempfile.mkdtemp(prefix="bench-recipes-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    finished = earlier_runs(work / "recipes.jsonl", recipes)
    given: dict[int, Path] = {}
    for run in args.cold_start_from:
        if not (run / "checkpoints").is_dir() or not (run.parents[1] / "config.toml").is_file():
            raise SystemExit(
                f"--cold-start-from {run}: not a bench run folder (OUT/RECIPE/seed_N/runs/"
                f"train-..., with checkpoints/ and OUT/RECIPE/seed_N/config.toml)"
            )
        given[tomllib.loads((run.parents[1] / "config.toml").read_text())["run"]["seed"]] = run
    for seed in seeds:  # seed-major: a cut run has every recipe on its first seeds
        first_run: Path | None = given.get(seed)
        for name, overrides in recipes.items():
            if (row := finished.get((name, seed))) is not None:
                print(f"{name}, seed {seed}: finished earlier in {work}", file=sys.stderr)
                rows.append(row)
                first_run = first_run or Path(row["result"]["run_dir"])
                continue
            sets = [f"--set={item}" for item in overrides]
            run_args = real_model.build_parser().parse_args(
                ["--config", args.config, *passthrough, *sets]
            )
            folder = work / name / f"seed_{seed}"
            start_from = None
            if (args.share_cold_start or seed in given) and first_run is not None:
                config = real_model.write_config(run_args, seed, folder)
                if (why := cold_start_differs(config, first_run)) is None:
                    start_from = first_run
                else:
                    print(f"{name}: its own cold start: {why}", file=sys.stderr, flush=True)
            result = real_model.run_seed(run_args, seed, folder, start_from)
            first_run = first_run or Path(result["run_dir"])
            row = {"recipe": name, "overrides": overrides, "result": result}
            rows.append(row)
            with open(work / "recipes.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            print(
                json.dumps({"recipe": name, "seed": seed, "stages": result["stages"]}), flush=True
            )
    print(table(summarize(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
