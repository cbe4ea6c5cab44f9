"""A real pretrained model learns to search: base -> cold start -> RL on the offline world.

Runs ``searchr1 train`` once per seed (``--seeds 0,1,2``; ``--seed`` for one), as a user
would, with a config (``--config``; default ``examples/real-model.toml``, SmolLM2-135M-Instruct,
``builtin:smollm2-135m-instruct``) and a held-out subset of its ``data.eval``
(``--eval-questions``, spread evenly over the data sources in file order), then reads the
run's events and eval records. One JSON line per seed::

    stages.{base,cold_start,rl}: held-out em, f1, format_rate, search_rate (share of questions
                                 with >= 1 search), searches per question, eval seconds, and
                                 per_source.<data_source>.{em,f1,format_rate,searches}
    ceiling_em                   the scripted ideal agent on the same questions
    seconds.{cold_start,rl,total} wall time of each stage and of the whole command (with
                                 cold_start_from: the cold start is that run's)
    tokens_per_s.{sampling,training}  RL rollout tokens / rollout seconds; trained tokens
                                 (advantage != 0) / train seconds
    peak_rss_gb                  of the train process
    peak_rss_gb_after.{base_eval,cold_start,rl_steps,final_eval}  its peak so far at each
                                 stage's end (so the stage that grew it shows)
    rl_gain_points               (em after RL - em after cold start) * 100
    cold_start_from              the run whose cold start this one's RL began from (bench/
                                 recipes.py --share-cold-start), else null

With several seeds, a last line ``{"bench": "real_model_seeds", ...}``: per stage, each
seed's EM and F1 (overall and per source), format rate and searches per question with the
mean and the spread (max - min), and each seed's peak RSS; then a table of the same. ``--gradient-checkpointing`` and ``--learner-chunk-tokens`` set the learner's
``[model.local]`` memory settings (to measure what they save).

    python bench/real_model.py                       # the documented run (docs/benchmarks.md)
    python bench/real_model.py --seeds 0,1,2         # results over seeds
    python bench/real_model.py --cold-start-steps 4 --rl-steps 2 --eval-questions 8  # quick
    python bench/real_model.py --set train.cold_start.lr=1e-3     # any key of the example
    python bench/real_model.py --config examples/real-model-hard.toml --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real-model.toml"


def heldout_subset(spec: str, n: int, out: Path) -> Path:
    """``n`` questions of the held-out set ``spec`` (a path or ``builtin:``), spread evenly
    over its data sources (the first of each), in file order, as a JSONL file."""
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    lines = Path(resolve(spec, load_registry().assets)).read_text().splitlines()
    by_source: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        if line.strip():
            by_source.setdefault(json.loads(line)["data_source"], []).append(i)
    chosen: list[int] = []
    for i, rows_of in enumerate(by_source.values()):
        chosen += rows_of[: n // len(by_source) + (1 if i < n % len(by_source) else 0)]
    rows = [lines[i] for i in sorted(chosen)]  # in file order
    out.write_text("\n".join(rows) + "\n")
    return out


def set_value(text: str, section: str, key: str, value: str) -> str:
    """``key = value`` inside ``[section]`` of a TOML text: replaced where the key is there,
    else added under the section's header (a new section at the end when it is missing)."""
    lines = text.splitlines()
    header = re.compile(r"^\[([A-Za-z0-9_.]+)\]\s*(#.*)?$")
    start = next(
        (i for i, line in enumerate(lines) if (m := header.match(line)) and m[1] == section), None
    )
    if start is None:
        return f"{text.rstrip()}\n\n[{section}]\n{key} = {value}\n"
    end = next((i for i in range(start + 1, len(lines)) if header.match(lines[i])), len(lines))
    assign = re.compile(rf"^{re.escape(key)}\s*=")
    at = next((i for i in range(start + 1, end) if assign.match(lines[i])), None)
    if at is None:
        lines.insert(start + 1, f"{key} = {value}")
    else:
        lines[at] = f"{key} = {value}"
    return "\n".join(lines) + "\n"


def stage(records_file: Path, event: dict) -> dict:
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line]
    searched = [r for r in records if r.get("search_calls", 0) > 0]
    by_source: dict[str, list[dict]] = {}
    for r in records:
        by_source.setdefault(r.get("data_source") or "none", []).append(r)

    def mean(rows: list[dict], key: str) -> float:
        return round(sum(float(r.get(key) or 0.0) for r in rows) / len(rows), 4)

    return {
        "em": round(event["em"], 4),
        "f1": round(event.get("f1") or 0.0, 4),
        "format_rate": round(event.get("format_rate") or 0.0, 4),
        "search_rate": round(len(searched) / len(records), 4) if records else 0.0,
        "searches_per_question": round(event.get("search_calls_mean") or 0.0, 3),
        "em_per_source": {
            key.removeprefix("em/"): round(value, 4)
            for key, value in event.items()
            if key.startswith("em/")
        },
        "per_source": {
            source: {
                "n": len(rows),
                "em": mean(rows, "em"),
                "f1": mean(rows, "f1"),
                "format_rate": mean(rows, "format_ok"),
                "searches": mean(rows, "search_calls"),
            }
            for source, rows in sorted(by_source.items())
        },
        "eval_seconds": event.get("seconds"),
        "n": event.get("n"),
        # the train process's peak so far, at the end of this eval (GiB)
        "peak_rss_gb": event.get("peak_rss_gb"),
    }


def sampled_tokens(metrics: dict, config: Path) -> float:
    """A step's sampled tokens: its first draw (questions_per_batch x group_size trajectories)
    times ``health/response_tokens``, their mean length."""
    rollout = tomllib.loads(config.read_text())["rollout"]
    trajectories = rollout["questions_per_batch"] * rollout["group_size"]
    return metrics.get("health/response_tokens", 0.0) * trajectories


def ceiling_em(config: Path) -> float | None:
    """EM of the training data's world's scripted ideal agent (``Asset.ceiling``) on the same
    held-out questions (no model: what the configured search and limits make answerable);
    None when the data has no ceiling agent."""
    import asyncio

    from searchr1.core.assets import asset_name, is_builtin
    from searchr1.core.config import load_config
    from searchr1.core.data import load_questions
    from searchr1.core.evaluation import evaluate
    from searchr1.core.plugins import load_registry
    from searchr1.core.protocols import make_protocol
    from searchr1.kit.tokenizers import load_tokenizer

    registry = load_registry()
    cfg = load_config(config, registry=registry)
    spec = str(cfg.data.train)
    asset = registry.assets.get(asset_name(spec)) if is_builtin(spec) else None
    if asset is None or asset.ceiling is None:
        return None
    protocol = make_protocol(cfg, load_tokenizer(cfg.model.base_model, cfg.assets), registry)
    agent = asset.ceiling(cfg, protocol.tokenizer, protocol)
    if agent is None:
        return None
    questions = list(load_questions(cfg.data.eval, cfg.assets).questions)
    search = registry.create("search_provider", cfg.search.provider, cfg)
    reward = registry.create("reward", cfg.reward.name, cfg)

    async def run() -> float:
        try:
            result = await evaluate(agent, search, protocol, reward, questions, cfg)
            return float(result.metrics["em"])
        finally:
            await search.aclose()

    return round(asyncio.run(run()), 4)


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags (``bench/recipes.py`` parses its runs' flags with it too)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="default: %(default)s")
    parser.add_argument("--eval-questions", type=int, default=48)
    parser.add_argument("--cold-start-steps", type=int, default=None, help="default: config's")
    parser.add_argument("--rl-steps", type=int, default=None, help="default: config's")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", help="comma-separated seeds, one run each (e.g. 0,1,2)")
    parser.add_argument(
        "--gradient-checkpointing",
        choices=("auto", "true", "false"),
        help="[model.local] gradient_checkpointing (default: the config's)",
    )
    parser.add_argument(
        "--learner-chunk-tokens", type=int, help="[model.local] learner_chunk_tokens"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one key of the config (TOML value), e.g. train.cold_start.lr=1e-3; "
        "added when the config lacks it; repeatable",
    )
    parser.add_argument("--out", type=Path, help="run folder parent (default: a temp folder)")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    work = Path(args.out or tempfile.mkdtemp(prefix="bench-real-model-"))
    results = [run_seed(args, seed, work / f"seed_{seed}") for seed in seeds]
    for result in results:
        print(json.dumps(result), flush=True)
    if len(results) > 1:
        summary = over_seeds(results)
        print(json.dumps(summary))
        print(seeds_table(summary))
    return 0


def spread(values: list[float]) -> dict:
    """The values with their mean and spread (max - min)."""
    return {
        "per_seed": values,
        "mean": round(sum(values) / len(values), 4),
        "spread": round(max(values) - min(values), 4),
    }


def over_seeds(results: list[dict]) -> dict:
    """Per stage: EM, F1, format rate and searches per question, overall and per source,
    each per seed with the mean and the spread."""
    keys = (("em", "em"), ("f1", "f1"), ("format_rate", "format_rate"))
    stages: dict[str, dict] = {}
    for name in ("base", "cold_start", "rl"):
        have = [r["stages"][name] for r in results if name in r["stages"]]
        if len(have) != len(results):
            continue
        sources = sorted({s for h in have for s in h["per_source"]})
        stages[name] = {
            **{key: spread([h[key] for h in have]) for key, _ in keys},
            "searches": spread([h["searches_per_question"] for h in have]),
            "per_source": {
                s: {
                    key: spread([h["per_source"].get(s, {}).get(key, 0.0) for h in have])
                    for key in ("em", "f1", "format_rate", "searches")
                }
                for s in sources
            },
        }
    return {
        "bench": "real_model_seeds",
        "seeds": [r["seed"] for r in results],
        "stages": stages,
        "rl_gain_points": [r["rl_gain_points"] for r in results],
        "ceiling_em": [r["ceiling_em"] for r in results],
        "peak_rss_gb": [r["peak_rss_gb"] for r in results],
        "seconds_total": [r["seconds"]["total"] for r in results],
    }


def seeds_table(summary: dict) -> str:
    """A Markdown table: per stage and source, EM / F1 / format / searches as mean (spread)."""

    def cell(s: dict, scale: float = 100.0) -> str:
        return f"{s['mean'] * scale:.1f} ({s['spread'] * scale:.1f})"

    lines = [
        "| stage | data_source | EM | F1 | format | searches / q |",
        "|---|---|---|---|---|---|",
    ]
    for name, st in summary["stages"].items():
        rows = [("all", {**st, "searches": st["searches"]}), *st["per_source"].items()]
        for source, m in rows:
            lines.append(
                f"| {name} | {source} | {cell(m['em'])} | {cell(m['f1'])} | "
                f"{cell(m['format_rate'])} | {cell(m['searches'], 1.0)} |"
            )
    return "\n".join(lines)


def write_config(args: argparse.Namespace, seed: int, work: Path) -> Path:
    """``work/config.toml``: the bench's config for ``seed`` (its flags and ``--set`` applied)."""
    work.mkdir(parents=True, exist_ok=True)
    text = args.config.read_text()
    eval_spec = tomllib.loads(text)["data"]["eval"]
    text = set_value(text, "run", "dir", json.dumps(str(work / "runs")))
    text = set_value(text, "run", "seed", str(seed))
    text = set_value(
        text,
        "data",
        "eval",
        json.dumps(str(heldout_subset(eval_spec, args.eval_questions, work / "heldout.jsonl"))),
    )
    if args.cold_start_steps is not None:
        text = set_value(text, "train.cold_start", "steps", str(args.cold_start_steps))
    if args.rl_steps is not None:
        text = set_value(text, "train", "max_steps", str(args.rl_steps))
        text = set_value(text, "train", "save_every", str(max(1, args.rl_steps)))
    text = set_value(text, "model.local", "threads", str(args.threads))
    if args.gradient_checkpointing is not None:
        value = args.gradient_checkpointing
        value = json.dumps(value) if value == "auto" else value
        text = set_value(text, "model.local", "gradient_checkpointing", value)
    if args.learner_chunk_tokens is not None:
        text = set_value(
            text, "model.local", "learner_chunk_tokens", str(args.learner_chunk_tokens)
        )
    for item in args.set:
        dotted, sep, value = item.partition("=")
        section, _, key = dotted.strip().rpartition(".")
        if not sep or not section:
            raise SystemExit(f"--set {item!r}: expected SECTION.KEY=VALUE")
        text = set_value(text, section, key, value.strip())
    config = work / "config.toml"
    config.write_text(text)
    return config


def cold_started_copy(source: Path, runs: Path) -> Path:
    """A copy of the run folder ``source`` under ``runs`` as it stood at checkpoint 0 (after
    its cold start, its evals "before" and "cold_start" and its step-0 eval): the folder a
    ``train --resume`` continues into RL from that cold start."""
    from searchr1.core.checkpoint import scan_checkpoints

    first = next((c for c in scan_checkpoints(source, resumable=False)[0] if c.step == 0), None)
    if first is None:
        raise SystemExit(f"{source}: no usable checkpoint 0 to start RL from")
    lines = (source / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    events = [json.loads(line) for line in lines]
    cut = max(
        i
        for i, e in enumerate(events)
        if (e.get("event") == "checkpoint" and e.get("step") == 0)
        or (e.get("event") == "eval/heldout_em" and e.get("when") in ("cold_start", "step_0"))
    )
    dest = runs / f"{source.name}-rl"
    (dest / "checkpoints").mkdir(parents=True)
    shutil.copytree(first.path, dest / "checkpoints" / first.path.name)
    for when in ("before", "cold_start", "step_0"):
        if (record := source / f"eval_heldout_{when}.jsonl").is_file():
            shutil.copy2(record, dest / record.name)
    (dest / "events.jsonl").write_text("".join(lines[: cut + 1]), encoding="utf-8")
    return dest


def run_seed(
    args: argparse.Namespace, seed: int, work: Path, start_from: Path | None = None
) -> dict:
    """One ``searchr1 train`` run of the example with ``seed``; its JSON result.
    ``start_from``: another run folder of this seed, whose cold start this run's RL begins
    from (``train --resume`` from its checkpoint 0; its "base" and "cold_start" stages are
    that run's)."""
    config = write_config(args, seed, work)
    text = config.read_text()
    env = {**os.environ, "SEARCHR1_LOAD_PLUGINS": ""}
    command = [str(Path(sys.executable).with_name("searchr1")), "train", "--config", str(config)]
    if start_from is not None:
        command += ["--resume", "--run-dir", str(cold_started_copy(start_from, work / "runs"))]
    t0 = time.perf_counter()
    proc = subprocess.run(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"searchr1 train exited {proc.returncode}")
    run_dir = max((work / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    from searchr1.core.logs import read_jsonl

    events = read_jsonl(run_dir / "events.jsonl")[0]
    evals = {e["when"]: e for e in events if e.get("event") == "eval/heldout_em"}
    done = next(e for e in events if e.get("event") == "cold_start_done")
    steps = [e for e in events if e.get("event") == "metrics"]
    stages = {
        name: stage(run_dir / f"eval_heldout_{when}.jsonl", evals[when])
        for name, when in (("base", "before"), ("cold_start", "cold_start"), ("rl", "after"))
        if when in evals
    }
    rollout_s = sum(s.get("time/rollout", 0.0) for s in steps)
    train_s = sum(s.get("time/train", 0.0) for s in steps)
    peaks = [
        e.get("peak_rss_gb") or e.get("memory/peak_rss_gb") or 0.0
        for e in events
        if e.get("event") in ("eval/heldout_em", "cold_start_done", "metrics")
    ]
    out = {
        "bench": "real_model",
        "seed": seed,
        "config": str(args.config),
        "model": tomllib.loads(text)["model"]["base_model"],
        "eval_questions": args.eval_questions,
        "cold_start_steps": done["steps"],
        "cold_start_kept": done["kept"],
        "rl_steps": len(steps),
        "stages": stages,
        "ceiling_em": ceiling_em(config),
        "rl_gain_points": round(100 * (stages["rl"]["em"] - stages["cold_start"]["em"]), 1)
        if {"rl", "cold_start"} <= stages.keys()
        else None,
        "seconds": {
            "cold_start": round(done["seconds"], 1),
            "rl": round(sum(s.get("time/step", 0.0) for s in steps), 1),
            "total": round(total, 1),
        },
        "tokens_per_s": {
            "sampling": round(sum(sampled_tokens(s, config) for s in steps) / rollout_s, 1)
            if rollout_s
            else None,
            "training": round(sum(s.get("tokens/trained", 0.0) for s in steps) / train_s, 1)
            if train_s
            else None,
        },
        # this seed's train process (the events' own peaks; RUSAGE_CHILDREN is the max over
        # every seed run so far)
        "peak_rss_gb": round(max(peaks), 2)
        if peaks
        else round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2),
        # the train process's peak so far at the end of each stage: where memory grew
        "peak_rss_gb_after": {
            "base_eval": evals.get("before", {}).get("peak_rss_gb"),
            "cold_start": done.get("peak_rss_gb"),
            "rl_steps": steps[-1].get("memory/peak_rss_gb") if steps else None,
            "final_eval": evals.get("after", {}).get("peak_rss_gb"),
        },
        "threads": args.threads,
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "run_dir": str(run_dir),
        "cold_start_from": str(start_from) if start_from is not None else None,
        "gradient_checkpointing": args.gradient_checkpointing,
        "learner_chunk_tokens": args.learner_chunk_tokens,
    }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
