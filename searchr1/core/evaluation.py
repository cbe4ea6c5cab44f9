"""Evaluation: :func:`evaluate` rolls questions out with training's rollout, search and reward
(greedy by default, in file order) and scores them per ``data_source``; ``searchr1 eval``,
``searchr1 smoke``, the Python API's ``run_rollout_group`` and the train loop's held-out,
periodic and ceiling evals all call it. EM/F1 against the golden answers
(:mod:`searchr1.core.answers`, SQuAD / Search-R1 normalisation) stay comparable with the
Search-R1 paper whatever the reward. Macro EM weighs every source equally, micro EM every
question. :meth:`EvalResult.numbers` is the one flat shape of an evaluation's scores that
events, metric sinks and the report carry."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.answers import exact_match, f1_score
from searchr1.core.checkpoint import BEST, checkpoints_dir
from searchr1.core.step_metrics import peak_rss_gb
from searchr1.core.types import (
    Question,
    RewardFn,
    RewardResult,
    Sampler,
    SearchProvider,
    Trajectory,
)
from searchr1.rl.rollout import RolloutConfigError, prompt_overflow

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.agent_protocol import AgentProtocol
    from searchr1.core.config_schema import Config
    from searchr1.core.sinks import SinkHub
    from searchr1.core.types import Asset
    from searchr1.rl.job import Environment

#: questions per ``rollout_questions`` call: bounds memory; fixed so batching is machine-independent
EVAL_CHUNK = 32

# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class EvalRecord:
    """One question's outcome: its scores and the trajectory that produced them."""

    question_id: str
    data_source: str
    em: float
    f1: float
    format_ok: bool
    reward: float
    search_calls: int
    search_errors: int
    trajectory: Mapping[str, Any]
    #: ``eval --judge``: the judge's score and whether it agrees with EM (None: no verdict)
    judge: float | None = None
    judge_vs_em: float | None = None

    @property
    def reward_result(self) -> RewardResult:
        """The run's reward of the trajectory, with its components."""
        return RewardResult(self.reward, dict(self.trajectory.get("components", {})))

    def to_dict(self) -> dict[str, Any]:
        """The scores (the judge's only when judged), then the readable trajectory."""
        scores = {k: v for k, v in vars(self).items() if k != "trajectory" and v is not None}
        return {**scores, **self.trajectory}


def score_trajectory(
    question: Question,
    traj: Trajectory,
    result: RewardResult,
    judged: RewardResult | None = None,
) -> EvalRecord:
    """One finished trajectory's record: the run's reward ``result``, EM/F1 and, with
    ``judged`` (the ``judge`` reward's result), the judge's score; the answer format is the
    verdict the rollout recorded (``Trajectory.format_ok``), whatever the reward."""
    verdict = judged.components if judged is not None else {}
    return EvalRecord(
        question_id=question.id,
        data_source=question.data_source,
        em=float(exact_match(traj.final_answer, question.golden_answers)),
        f1=f1_score(traj.final_answer, question.golden_answers),
        format_ok=traj.format_ok,
        reward=float(result.reward),
        search_calls=traj.search_calls,
        search_errors=traj.search_errors,
        trajectory=traj.to_dict(result),
        judge=verdict.get("judge"),
        judge_vs_em=verdict.get("judge_vs_em"),
    )


# --------------------------------------------------------------------------- metrics


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _group_metrics(records: Sequence[EvalRecord]) -> dict[str, Any]:
    calls = sum(r.search_calls for r in records)
    errors = sum(r.search_errors for r in records)
    judged = {
        key: _mean([v for r in records if (v := getattr(r, key)) is not None])
        for key in ("judge", "judge_vs_em")
        if any(getattr(r, key) is not None for r in records)
    }
    return {
        **judged,
        "n": len(records),
        "em": _mean([r.em for r in records]),
        "f1": _mean([r.f1 for r in records]),
        "format_rate": _mean([float(r.format_ok) for r in records]),
        "reward_mean": _mean([r.reward for r in records]),
        "search_calls_mean": _mean([float(r.search_calls) for r in records]),
        "search_calls": calls,
        "search_errors": errors,
        # No search at all is not a search failure: report 1.0 so it is never flagged.
        "search_success_rate": 1.0 - errors / calls if calls else 1.0,
    }


def summarize(records: Sequence[EvalRecord], *, min_success_rate: float = 0.9) -> dict[str, Any]:
    """Overall and per-source metrics: ``n``, ``em`` (= ``micro_em``), ``macro_em``,
    ``f1``, ``format_rate``, ``reward_mean``, ``search_calls_mean``, ``search_success_rate``,
    ``trustworthy`` (search success >= ``min_success_rate``), ``per_source``."""
    by_source: dict[str, list[EvalRecord]] = defaultdict(list)
    for r in records:
        by_source[r.data_source].append(r)
    per_source = {s: _group_metrics(rs) for s, rs in sorted(by_source.items())}
    overall = _group_metrics(records)
    overall["micro_em"] = overall["em"]
    overall["macro_em"] = _mean([m["em"] for m in per_source.values()])
    overall["min_success_rate"] = min_success_rate
    overall["trustworthy"] = overall["search_success_rate"] >= min_success_rate
    overall["per_source"] = per_source
    return overall


#: the per-source numbers of :meth:`EvalResult.numbers`, each as ``<key>/<source>``
PER_SOURCE = ("em", "n", "f1", "format_rate", "search_success_rate")


@dataclass
class EvalResult:
    """``metrics`` (:func:`summarize`) and one record per trajectory, in question order;
    ``trajectories`` (the finished trajectories, aligned with ``records``) only when
    :func:`evaluate` was asked to keep them."""

    label: str
    metrics: dict[str, Any]
    records: list[EvalRecord] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)

    def numbers(self) -> dict[str, float]:
        """The scores as one flat record, the shape every event (``eval_result``,
        ``eval/heldout_em``), the metric sinks (prefixed ``eval/heldout_``) and the report
        read: each scalar of :attr:`metrics` (``em``, ``macro_em``, ``f1``, ``format_rate``,
        ``search_success_rate``, ``n``, ...) and, per data source, ``<key>/<source>`` for each
        of :data:`PER_SOURCE` (``em/nq``; a source without a name is ``none``)."""
        out: dict[str, float] = {
            key: value
            for key, value in self.metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        for source, m in self.metrics["per_source"].items():
            for key in PER_SOURCE:
                out[f"{key}/{source or 'none'}"] = m[key]
        return out


# --------------------------------------------------------------------------- running


async def evaluate(
    sampler: Sampler,
    search: SearchProvider,
    protocol: AgentProtocol,
    reward: RewardFn,
    questions: Sequence[Question],
    config: Config,
    *,
    label: str = "eval",
    group_size: int = 1,
    greedy: bool = True,
    seeded: bool = True,
    id_prefix: str | None = None,
    progress: str | None = None,
    judge: RewardFn | None = None,
    keep_trajectories: bool = False,
) -> EvalResult:
    """Roll out every question ``group_size`` times, in order, with ``sampler`` (a run's
    model, or a scripted agent: the ceiling) through ``search`` and ``protocol``, and score
    each trajectory by ``reward`` (and, with ``judge``, by the ``judge`` reward too, ``eval
    --judge``): one :class:`EvalRecord` per trajectory. An
    :class:`~searchr1.rl.job.Environment` passes its own parts (:func:`evaluate_run`).

    Sampling is the rollout's, greedy unless ``greedy`` is false; ``seeded``: with
    ``run.seed`` (an eval is reproducible), else unseeded as a training draw's first turn
    (smoke, the API). Trajectory ids are ``{id_prefix}{question.id}/{i}`` (``id_prefix``
    default ``"<label>/"``). With ``progress`` (a task name), log a ``progress`` event as it
    begins and after each chunk of :data:`EVAL_CHUNK` questions. ``keep_trajectories``: the
    result keeps the finished trajectories too (tokens and all; smoke and the API read them).
    Exceptions of the rollout (the model channel, ``RolloutConfigError``) propagate."""
    from searchr1.core.logs import get_logger
    from searchr1.rl.rollout import rollout_questions, sampling_params

    sampling = sampling_params(config, protocol, greedy=greedy)
    if seeded:
        sampling = dataclasses.replace(sampling, seed=config.run.seed)
    prefix = f"{label}/" if id_prefix is None else id_prefix
    result = EvalResult(label=label, metrics={})
    if progress is not None:  # the eval has begun (its bar shows before the first chunk ends)
        get_logger().info("progress", task=progress, done=0, total=len(questions))
    for start in range(0, len(questions), EVAL_CHUNK):
        chunk = list(questions[start : start + EVAL_CHUNK])
        groups = await rollout_questions(
            sampler,
            search,
            protocol,
            chunk,
            config,
            group_size=group_size,
            sampling=sampling,
            id_prefix=prefix,
        )
        await _score_into(result, chunk, groups, reward, judge, keep_trajectories)
        if progress is not None:
            done = start + len(chunk)
            get_logger().info("progress", task=progress, done=done, total=len(questions))
    result.metrics = summarize(result.records, min_success_rate=config.search.min_success_rate)
    return result


async def _score_into(
    result: EvalResult,
    chunk: Sequence[Question],
    groups: Sequence[Sequence[Trajectory]],
    reward: RewardFn,
    judge: RewardFn | None,
    keep_trajectories: bool,
) -> None:
    """Score each question's trajectories by ``reward`` (and ``judge``) into ``result``'s
    records, in order."""
    from searchr1.core.rewards import score_all

    pairs = [(q, t) for q, g in zip(chunk, groups, strict=True) for t in g]
    items = [(t, q.golden_answers) for q, t in pairs]
    scored = await score_all(reward, items)
    judged = await score_all(judge, items) if judge is not None else [None] * len(items)
    for (question, traj), score, verdict in zip(pairs, scored, judged, strict=True):
        result.records.append(score_trajectory(question, traj, score, verdict))
        if keep_trajectories:
            result.trajectories.append(traj)


async def evaluate_run(
    env: Environment, questions: Sequence[Question], **options: Any
) -> EvalResult:
    """:func:`evaluate` in ``env``: its sampler, search, protocol, reward and config."""
    return await evaluate(
        env.sampler, env.search, env.protocol, env.reward, questions, env.config, **options
    )


# --------------------------------------------------------------------------- output


def write_records(path: Path, result: EvalResult) -> None:
    """One JSON line per question (scores and the readable trajectory), written whole
    (:func:`~searchr1.core.disk.atomic_write`)."""
    from searchr1.core.disk import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        for record in result.records:
            f.write(json.dumps({"label": result.label, **record.to_dict()}, ensure_ascii=False))
            f.write("\n")


def _pct(value: float) -> str:
    return "   -" if value is None or math.isnan(value) else f"{100 * value:5.1f}"


def format_table(result: EvalResult) -> str:
    """The per-source table ``searchr1 eval`` prints for one model."""
    m = result.metrics
    head = f"{'data_source':<16} {'n':>5} {'EM':>6} {'F1':>6} {'format':>6} {'search/q':>8} {'search ok':>9}"
    lines = [f"== {result.label}", head, "-" * len(head)]

    def row(name: str, g: Mapping[str, Any]) -> str:
        return (
            f"{name:<16} {g['n']:>5} {_pct(g['em']):>6} {_pct(g['f1']):>6} "
            f"{_pct(g['format_rate']):>6} {g['search_calls_mean']:>8.2f} "
            f"{_pct(g['search_success_rate']):>9}"
        )

    for source, g in m["per_source"].items():
        lines.append(row(source or "(none)", g))
    lines.append("-" * len(head))
    lines.append(row("micro (all)", m))
    lines.append(f"{'macro EM':<16} {'':>5} {_pct(m['macro_em']):>6}")
    if "judge" in m:
        lines.append(
            f"{'judge':<16} {'':>5} {_pct(m['judge']):>6}  (agrees with EM on "
            f"{_pct(m.get('judge_vs_em', math.nan)).strip()}% of the judged answers)"
        )
    lines.extend(trust_warning(result))
    return "\n".join(lines)


def trust_warning(result: EvalResult) -> list[str]:
    """A warning line when search failed too often for the scores to mean anything."""
    m = result.metrics
    if m["trustworthy"]:
        return []
    return [
        f"WARNING: {result.label}: search success {100 * m['search_success_rate']:.1f}% "
        f"< {100 * m['min_success_rate']:.0f}% ({m['search_errors']} of {m['search_calls']} "
        "searches failed): these scores are NOT trustworthy"
    ]


def format_comparison(results: Iterable[EvalResult]) -> str:
    """One column per evaluated model (``base``, ``step_20``, ...): EM per source, macro and
    micro EM, format rate and search success."""
    results = list(results)
    sources = sorted({s for r in results for s in r.metrics["per_source"]})
    width = max(10, *(len(r.label) for r in results))
    lines = [f"{'EM':<16}" + "".join(f" {r.label:>{width}}" for r in results)]
    lines.append("-" * len(lines[0]))
    for s in sources:
        cells = [r.metrics["per_source"].get(s, {}).get("em", float("nan")) for r in results]
        lines.append(f"{s or '(none)':<16}" + "".join(f" {_pct(c):>{width}}" for c in cells))
    lines.append("-" * len(lines[0]))
    for key, name in (
        ("macro_em", "macro EM"),
        ("micro_em", "micro EM"),
        ("f1", "F1"),
        ("format_rate", "format"),
        ("search_success_rate", "search ok"),
    ):
        lines.append(f"{name:<16}" + "".join(f" {_pct(r.metrics[key]):>{width}}" for r in results))
    return "\n".join(lines)


# --------------------------------------------------------------------------- during training


def heldout_questions(config: Config) -> list[Question]:
    """``data.eval``'s questions when ``train.eval_before_after`` or ``train.eval_every``
    asks for them, else none; ``train`` reads them before the (slow) model load, so a bad
    path fails first. ConfigError when ``eval_every`` or ``keep_best`` is set without what
    it needs (:func:`~searchr1.core.config_validate.heldout_refusals`)."""
    from searchr1.core.config_validate import heldout_refusals
    from searchr1.core.errors import ConfigError

    problems = heldout_refusals(config)
    if problems:
        raise ConfigError(problems)
    t = config.train
    if not ((t.eval_before_after or t.eval_every) and config.data.eval):
        return []
    from searchr1.core.data import load_questions

    loaded = load_questions(config.data.eval, config.assets, field_name="data.eval", report=True)
    return list(loaded.questions)


def ceiling_agent(env: Environment, assets: Mapping[str, Asset]) -> Sampler | None:
    """The ceiling agent of ``data.eval``'s ``builtin:`` asset (:attr:`Asset.ceiling`, among
    ``assets``) for ``env``'s protocol, or None: what a perfect searcher scores on the
    held-out set."""
    from searchr1.core.assets import asset_name, is_builtin

    spec = env.config.data.eval
    asset = assets.get(asset_name(spec)) if is_builtin(spec) else None
    if asset is None or asset.ceiling is None:
        return None
    return asset.ceiling(env.config, env.sampler.tokenizer, env.protocol)


async def heldout_eval(
    env: Environment,
    folder: Path,
    questions: Sequence[Question],
    when: str,
    *,
    step: int = 0,
    sampler: Sampler | None = None,
    sinks: SinkHub | None = None,
) -> EvalResult | None:
    """Evaluate ``sampler`` (default: ``env``'s) on ``questions`` inside train's event loop;
    writes ``eval_heldout_<when>.jsonl`` into the run ``folder`` and logs one
    ``eval/heldout_em`` event, the numbers of :meth:`EvalResult.numbers` with ``when``,
    ``step``, ``seconds``, ``peak_rss_gb`` and ``trustworthy`` (the numbers also sent to the
    metric ``sinks``, each prefixed ``eval/heldout_``; None: the caller sends them). An
    eval whose search success was under ``search.min_success_rate`` is flagged as ``searchr1
    eval`` flags it (:func:`trust_warning`): ``trustworthy`` false and a
    ``heldout_untrusted`` warning. A scripted ``sampler`` that cannot play
    the protocol (ValueError) is skipped with a warning."""
    from searchr1.core.logs import get_logger
    from searchr1.core.rewards import reward_metrics

    t0 = time.perf_counter()
    try:
        result = await evaluate_run(
            dataclasses.replace(env, sampler=sampler or env.sampler),
            questions,
            label=f"heldout-{when}",
            progress=f"held-out eval {when}",
        )
    except ValueError as exc:
        if sampler is None:
            raise
        get_logger().warning(f"{when}_skipped", reason=str(exc))
        return None
    finally:
        env.search.metrics(reset=True)  # eval searches are not a training step's
        reward_metrics(env.reward, reset=True)  # nor its judge calls (the run's totals keep them)
    write_records(folder / f"eval_heldout_{when}.jsonl", result)
    numbers = {
        **result.numbers(),
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_rss_gb": peak_rss_gb(),
    }
    trusted = bool(result.metrics["trustworthy"])
    get_logger().info("eval/heldout_em", when=when, step=step, trustworthy=trusted, **numbers)
    for line in trust_warning(result):  # as ``searchr1 eval`` says it
        get_logger().warning(
            "heldout_untrusted", when=when, step=step, message=line.removeprefix("WARNING: ")
        )
    if sinks is not None:
        sinks.scalars(step, heldout_metrics(numbers))
    return result


def heldout_metrics(numbers: Mapping[str, float]) -> dict[str, float]:
    """``numbers`` (:meth:`EvalResult.numbers`) as the metric sinks and the step's
    ``metrics`` event carry a held-out eval: each prefixed ``eval/heldout_``."""
    return {f"eval/heldout_{key}": value for key, value in numbers.items()}


#: the numbers of a periodic eval that join the step's ``metrics`` event (with ``em/<source>``)
PERIODIC = ("em", "format_rate", "search_calls_mean")


def balanced_subset(questions: Sequence[Question], n: int) -> list[Question]:
    """The first ``n`` questions (all when ``n`` is 0 or more than there are), taken in turn
    from each ``data_source`` in file order, so a small subset scores every skill."""
    if n <= 0 or n >= len(questions):
        return list(questions)
    by_source: dict[str, list[Question]] = defaultdict(list)
    for q in questions:
        by_source[q.data_source].append(q)
    queues = [iter(qs) for qs in by_source.values()]
    picked: list[Question] = []
    while len(picked) < n:
        for queue in queues:
            q = next(queue, None)
            if q is not None and len(picked) < n:
                picked.append(q)
    return picked


@dataclass
class PeriodicEval:
    """``[train] eval_every``: held-out EM on a fixed subset (``eval_questions``, balanced
    across data sources) at the start of RL (step 0), after every ``every``-th step and after
    the last; with ``keep_best`` the best EM so far (the earliest step on a tie) and its step.
    The best checkpoint's ``trainer.json`` records them under ``best_heldout``, so a resumed
    run keeps the best so far (:meth:`resume`)."""

    every: int
    questions: list[Question]
    keep_best: bool
    best_step: int | None = None
    best_em: float = -math.inf

    @classmethod
    def for_config(cls, config: Config, heldout: Sequence[Question]) -> PeriodicEval | None:
        """None when ``train.eval_every`` is 0 (:func:`heldout_questions` checked the rest)."""
        t = config.train
        if not t.eval_every:
            return None
        return cls(t.eval_every, balanced_subset(heldout, t.eval_questions), t.keep_best)

    def due(self, step: int, last: int) -> bool:
        return step == 0 or step % self.every == 0 or step == last

    async def evaluate(self, env: Environment, folder: Path, step: int) -> dict[str, float]:
        """Evaluate ``env``'s current weights as step ``step``'s (records into the run
        ``folder``); returns the ``eval/heldout_*``
        metrics the step's ``metrics`` event carries (:data:`PERIODIC` and ``em/<source>``
        of :func:`heldout_metrics`). Updates the best (see :meth:`is_best`)."""
        result = await heldout_eval(env, folder, self.questions, f"step_{step}", step=step)
        assert result is not None  # the run's own sampler: errors raise
        em = float(result.metrics["em"])
        # an EM scored while search was failing says nothing of the weights: never the best
        if self.keep_best and em > self.best_em and result.metrics["trustworthy"]:
            self.best_step, self.best_em = step, em
        numbers = result.numbers()
        return heldout_metrics(
            {k: float(v) for k, v in numbers.items() if k in PERIODIC or k.startswith("em/")}
        )

    def is_best(self, step: int) -> bool:
        """Whether step ``step``'s eval set a new best (its checkpoint becomes ``best``)."""
        return self.keep_best and self.best_step == step

    def state(self) -> dict[str, Any]:
        """What the best checkpoint's ``trainer.json`` records as ``best_heldout``."""
        return {"step": self.best_step, "em": self.best_em, "questions": len(self.questions)}

    def resume(self, run_dir: Path) -> None:
        """Take the best so far from ``checkpoints/best`` (left by the run being resumed)."""
        meta = checkpoints_dir(run_dir) / BEST / "trainer.json"
        if not (self.keep_best and meta.is_file()):
            return
        try:
            saved = json.loads(meta.read_text("utf-8")).get("best_heldout") or {}
            self.best_step, self.best_em = int(saved["step"]), float(saved["em"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            from searchr1.core.logs import get_logger

            get_logger().warning(
                "best_checkpoint_unreadable",
                path=str(meta),
                message="the best held-out EM so far is unknown; the next periodic eval "
                "replaces checkpoints/best",
            )

    def summary(self, run_dir: Path) -> dict[str, Any]:
        """The ``best_checkpoint`` event's fields (empty before any eval, or without
        ``keep_best``)."""
        if not self.keep_best or self.best_step is None:
            return {}
        return {
            "step": self.best_step,
            "em": self.best_em,
            "questions": len(self.questions),
            "path": str(checkpoints_dir(run_dir) / BEST),
            "message": f"the best held-out EM ({100 * self.best_em:.1f}% on "
            f"{len(self.questions)} questions) was at step {self.best_step}; evaluate it with "
            f"searchr1 eval --checkpoint {run_dir}:best",
        }


def check_fit(
    protocol: AgentProtocol, questions: Sequence[Question], limit: int, field: str
) -> None:
    """RolloutConfigError when a question of ``questions`` (read from ``field``) has a prompt
    that alone fills ``rollout.max_trajectory_tokens = limit``, naming the first and how many:
    an eval scores a fixed set of questions, so it is refused before any is rolled out (about
    0.2 ms a question) rather than stopped on the first such one, part-way through."""
    over = [found for q in questions if (found := prompt_overflow(protocol, q, limit))]
    if over:
        more = (
            f" (and {len(over) - 1} more question{'s' * (len(over) > 2)})" if len(over) > 1 else ""
        )
        raise RolloutConfigError(
            f"{field}: {over[0]}{more}; raise rollout.max_trajectory_tokens, or leave them out"
        )
