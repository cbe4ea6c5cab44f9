"""``searchr1 eval``: score the base model, checkpoints or a hosted model on a QA file.

:func:`main` evaluates each requested model in one event loop
(:func:`searchr1.core.evaluation.evaluate`) and writes ``eval_<label>.jsonl`` and
``eval_summary.json``; a checkpoint is evaluated with the settings saved beside it
(:func:`checkpoint_config`) unless ``--config`` is given (docs/commands.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.cli.args import CONFIG_HELP, add_no_cache_arg, open_run_from_args
from searchr1.core.checkpoint import (
    BASE,
    config_changes,
    find_checkpoint,
    load_trainer_state,
    saved_config,
)
from searchr1.core.disk import write_text_atomic
from searchr1.core.errors import EnvironmentDown, Interrupted, UserError
from searchr1.core.logs import say
from searchr1.core.stop import Stop

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.config_schema import Config, ModelConfig
    from searchr1.core.plugins import Registry
    from searchr1.core.runs import Run
    from searchr1.core.types import Question, Trainer
    from searchr1.rl.job import Environment

#: the sections a checkpoint is evaluated with from its own saved config
SAVED_SECTIONS = ("model", "lora", "rollout", "search")


def saved_config_path(targets: Sequence[tuple[str, str | None]]) -> Path | None:
    """The ``config.toml`` saved beside the first train checkpoint among ``targets`` (its
    model folder's parent holds ``trainer.json``), or None (only ``base``, or model state
    folders)."""
    for _, folder in targets:
        if folder is None:
            continue
        checkpoint = Path(folder).parent
        if (checkpoint / "trainer.json").is_file() and (checkpoint / "config.toml").is_file():
            return checkpoint / "config.toml"
    return None


def config_differences(given: Config, saved: dict[str, Any]) -> list[str]:
    """One line per field of :data:`SAVED_SECTIONS` where ``given`` and the checkpoint's
    saved config (redacted TOML, as saved) differ, in the given config's order."""
    return [
        f"eval: --config differs from the checkpoint's config at {key}: "
        f"{ours!r} (--config) vs {theirs!r} (checkpoint)"
        for key, theirs, ours in config_changes(given, saved, SAVED_SECTIONS)
    ]


#: the sections an evaluation takes from the config it runs with, never from a checkpoint's:
#: where it writes, the data it reads by default, where it logs. Every other section is the
#: trained model's (its model, LoRA, rollout, search, reward, and the [train] its rollout
#: limits were checked against).
LOCAL_SECTIONS = ("run", "data", "log")


def checkpoint_config(
    current: Config, saved_path: Path, saved: dict[str, Any], registry: Registry
) -> Config:
    """The checkpoint's saved config, checked as the whole it was trained with (so a problem
    is named at its line of ``saved_path``), with :data:`LOCAL_SECTIONS` of ``current``. A
    secret, saved as ``***``, keeps the value ``current`` has (its ``${VAR}``), or is left
    out."""
    import tomli_w

    from searchr1.core.checkpoint import toml_safe
    from searchr1.core.config import parse_config
    from searchr1.core.config_schema import SECTIONS
    from searchr1.core.secrets import REDACTED

    plain = toml_safe(current.to_dict(redact=False))

    def unmask(table: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in table.items():
            if isinstance(value, dict):
                out[key] = unmask(value, mine.get(key) if isinstance(mine.get(key), dict) else {})
            elif value == REDACTED or (isinstance(value, list) and REDACTED in value):
                if key in mine:
                    out[key] = mine[key]
            else:
                out[key] = value
        return out

    parsed = parse_config(
        tomli_w.dumps(unmask(saved, plain)),  # the saved file is a tomli_w dump: same lines
        source=str(saved_path),
        env=os.environ,
        registry=registry,
    )
    plugins = {
        key: table
        for key, table in current.plugins.items()
        if key.split(".", 1)[0] in LOCAL_SECTIONS
    }
    plugins.update(
        (key, table)
        for key, table in parsed.plugins.items()
        if key.split(".", 1)[0] not in LOCAL_SECTIONS
    )
    return current.replace(
        **{s: getattr(parsed, s) for s in SECTIONS if s not in LOCAL_SECTIONS},
        plugins=plugins,
        secrets=current.secrets | parsed.secrets,
    )


def _eval_config(
    args: argparse.Namespace, targets: Sequence[tuple[str, str | None]], registry: Registry
) -> Config | None:
    """The config to evaluate ``targets`` with: the checkpoint's saved settings unless
    ``--config`` was given (then a warning per difference); None: ``--config`` as is."""
    from searchr1.core.config import load_config

    saved_path = saved_config_path(targets)
    if saved_path is None:
        return None
    try:
        saved = saved_config(saved_path.parent)
    except (OSError, ValueError) as exc:  # not UTF-8, or not TOML
        raise UserError(f"--checkpoint: cannot read the saved config {saved_path}: {exc}") from None
    current = load_config(args.config, registry=registry)
    if args.config_reason == "--config":
        for line in config_differences(current, saved):
            print(f"searchr1: warning: {line}", file=sys.stderr)
        return current
    say(
        f"eval: the settings the checkpoint was trained with, from {saved_path} "
        f"({', '.join(f'[{s}]' for s in LOCAL_SECTIONS)} from {current.source}; give --config "
        "to use another config's)"
    )
    return checkpoint_config(current, saved_path, saved, registry)


async def _evaluate_all(
    env: Environment,
    trainer: Trainer | None,
    stop: Stop,
    folder: Path,
    questions: list[Any],
    targets: list[tuple[str, str | None]],
    *,
    data_path: str,
    greedy: bool,
    written: list[Path],
    judge: Any = None,
) -> dict[str, Any]:
    """Every requested model in turn in ``env`` (a checkpoint loaded into ``trainer``), inside
    one event loop (each answer also scored by ``judge``, the ``judge`` reward, for
    ``--judge``), its records' file in the run ``folder`` appended to ``written``; a ``stop``
    cuts the model being evaluated short."""
    from searchr1.core.evaluation import check_fit, evaluate_run, write_records
    from searchr1.core.logs import get_logger
    from searchr1.core.rewards import check_reward, reward_metrics

    log = get_logger()
    results: dict[str, Any] = {}
    if judge is not None and questions:  # --judge's judge, asked once as the reward's was
        await check_reward(judge, questions[0])
    limit = env.config.rollout.max_trajectory_tokens
    check_fit(env.protocol, questions, limit, f"--data = {data_path!r}")
    # The base model first: once a checkpoint is loaded there is no way back to it.
    for label, checkpoint in sorted(targets, key=lambda t: t[1] is not None):
        if checkpoint is not None:
            await _load_checkpoint(trainer, env.config.model, checkpoint)
        log.info("eval_start", label=label, data=data_path, questions=len(questions))
        evaluation = evaluate_run(
            env,
            questions,
            label=label,
            greedy=greedy,
            progress=f"eval {label}",
            judge=judge,
        )
        result = await stop.cut(evaluation, f"the eval of {label}")
        if judge is not None:  # what this model's answers cost the judge
            log.info("eval_judge", label=label, **reward_metrics(judge, reset=True))
        write_records(folder / f"eval_{label}.jsonl", result)
        written.append(folder / f"eval_{label}.jsonl")
        log.info(
            "eval_result",
            label=label,
            data=data_path,
            checkpoint=checkpoint,
            greedy=greedy,
            trustworthy=result.metrics["trustworthy"],
            **result.numbers(),
        )
        results[label] = result
    return results


async def _load_checkpoint(trainer: Trainer | None, model: ModelConfig, folder: str) -> None:
    """Load the model state in ``folder`` into ``trainer`` (of the ``model`` settings); a
    provider without one, or files it cannot read, is a UserError."""
    if trainer is None:
        raise UserError(
            f"--checkpoint {folder!r}: model provider {model.provider!r} only samples: it has "
            f"no trainer to load a checkpoint into; evaluate 'base' with it, or choose the "
            f"provider that saved the checkpoint"
        )

    def cannot(exc: Exception) -> str:
        if isinstance(exc, NotImplementedError):
            return (
                f"--checkpoint {folder!r}: model provider {model.provider!r} cannot load "
                f"checkpoints ({exc})"
            )
        return (
            f"--checkpoint {folder!r}: the model state there cannot be loaded "
            f"({type(exc).__name__}: {exc}); was it saved by model provider "
            f"{model.provider!r} from base_model {model.base_model!r}?"
        )

    await load_trainer_state(trainer, folder, cannot)


def limit_per_source(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """The first ``limit`` questions of each ``data_source``, in file order (the public
    replication evaluated 10 per benchmark); ``None`` keeps all. :func:`main` calls it for
    ``--limit-per-source``."""
    if limit is None:
        return list(questions)
    taken: Counter[str] = Counter()
    out: list[Question] = []
    for q in questions:
        if taken[q.data_source] < limit:
            taken[q.data_source] += 1
            out.append(q)
    return out


def main(args: argparse.Namespace) -> int:
    """``searchr1 eval``: see the module docstring."""
    if args.limit_per_source is not None and args.limit_per_source < 1:
        raise UserError(f"--limit-per-source must be >= 1, got {args.limit_per_source}")
    targets = [find_checkpoint(spec) for spec in args.checkpoint or [BASE]]
    labels = [label for label, _ in targets]
    if len(set(labels)) != len(labels):
        raise UserError(f"--checkpoint: two models would share a label: {labels}")
    from searchr1.core.plugins import load_registry

    registry = getattr(args, "registry", None) or load_registry()
    with Stop().installed() as stop:
        config = _eval_config(args, targets, registry)
        with open_run_from_args(args, "eval", config=config, registry=registry, stop=stop) as run:
            return _evaluate_in(run, args, targets, labels)  # closed: a refused write names the run


def _evaluate_in(
    run: Run, args: argparse.Namespace, targets: list[tuple[str, str | None]], labels: list[str]
) -> int:
    from searchr1.core.data import load_questions

    config = run.config
    data_path = args.data or config.data.eval
    loaded = load_questions(
        data_path, config.assets, field_name="--data" if args.data else "data.eval", report=True
    )
    questions = limit_per_source(loaded.questions, args.limit_per_source)

    # [reward.judge] checked before any model is loaded
    judge = run.registry.create("reward", "judge", config) if args.judge else None
    written: list[Path] = []  # each evaluated model's records

    async def evaluate_all() -> dict[str, Any]:
        await run.start(check=questions[0] if questions else None)
        try:
            return await _evaluate_all(
                run.env,
                run.model.trainer,
                run.stop,
                run.folder,
                questions,
                targets,
                data_path=data_path,
                greedy=not args.sample,
                written=written,
                judge=judge,
            )
        finally:  # async HTTP clients close in the loop they were used in
            await run.search.aclose()
            if judge is not None:
                from searchr1.core.rewards import close_reward

                await close_reward(judge)
            await run.aclose()

    try:
        results = asyncio.run(evaluate_all())
    except Interrupted as stop:
        kept = ", ".join(map(str, written)) if written else "nothing (no model was evaluated)"
        again = shlex.join(["searchr1", *sys.argv[1:]]) if sys.argv[1:] else "searchr1 eval"
        raise stop.outcome(kept, f"evaluate again with `{again}`") from None

    ordered = [results[label] for label in labels]
    summary = {
        "data": data_path,
        "questions": len(questions),
        "malformed_rows": len(loaded.malformed),
        "limit_per_source": args.limit_per_source,
        "greedy": not args.sample,
        "results": {r.label: r.metrics for r in ordered},
    }
    write_text_atomic(run.folder / "eval_summary.json", json.dumps(summary, indent=2) + "\n")
    _report(ordered, run.folder, config.search.min_success_rate)
    return 0


def _report(ordered: list[Any], folder: Path, min_success_rate: float) -> None:
    """Print each model's table (and their comparison) and where the records are; scores a
    search outage spoilt are an EnvironmentDown (exit 3: ``eval && publish`` stops)."""
    from searchr1.core.evaluation import format_comparison, format_table, trust_warning

    say()
    for r in ordered:
        say(format_table(r))
        say()
    if len(ordered) > 1:
        say(format_comparison(ordered))
        say()
    for r in ordered:
        for line in trust_warning(r):
            say(line)
    say(f"records: {folder}/eval_<label>.jsonl; summary: {folder}/eval_summary.json")
    if untrusted := [r.label for r in ordered if not r.metrics["trustworthy"]]:
        # exit 3, not 0: `searchr1 eval && publish` must not go on with these scores
        raise EnvironmentDown(
            f"eval: search failed too often for the scores of {', '.join(untrusted)} to mean "
            f"anything (success under search.min_success_rate = "
            f"{min_success_rate:.0%}); they are written above, but fix the "
            f"search environment (the search_failed events say what failed) and evaluate again"
        )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval", help="score the base model, checkpoints or a hosted model on a QA file"
    )
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--run-dir", help="folder for this eval's records and logs")
    p.add_argument("--data", help="QA file (default: data.eval from the config)")
    p.add_argument(
        "--checkpoint",
        action="append",
        metavar="DIR",
        help="checkpoint folder to evaluate (repeatable; 'base' = the base model; "
        "RUN:best = the run's best held-out checkpoint, [train] keep_best; "
        "default: base only). Several give a comparison table.",
    )
    p.add_argument(
        "--limit-per-source",
        type=int,
        metavar="N",
        help="only the first N questions of each data_source (a fixed subset)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="sample at the rollout temperature (seeded with run.seed) instead of greedy",
    )
    p.add_argument(
        "--judge",
        action="store_true",
        help="also score every answer by the LLM judge of [reward.judge] (docs/rewards.md)",
    )
    add_no_cache_arg(p)
    p.set_defaults(func=main)
