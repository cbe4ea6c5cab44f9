"""``searchr1 train``: the Search-R1 loop, top to bottom.

docs/architecture.md, "The loop", draws it; docs/training.md says what each phase and
setting does (pipelined steps with ``max_staleness``, stopping, resuming).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.checkpoint import latest_checkpoint, remove_stale_saves, restore_rng
from searchr1.core.cold_start import cold_start, cold_start_loss, cold_start_settings
from searchr1.core.config_schema import ColdStartSettings, Config
from searchr1.core.data import load_questions
from searchr1.core.distributed import check_supported
from searchr1.core.errors import ConfigError, HealthStop, Interrupted, SearchR1Error
from searchr1.core.evaluation import (
    BEST,
    PeriodicEval,
    ceiling_agent,
    check_fit,
    heldout_eval,
    heldout_questions,
)
from searchr1.core.health import Health
from searchr1.core.logs import RunLog, get_logger, warn
from searchr1.core.question_stream import QuestionStream
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.rewards import close_reward
from searchr1.core.runs import Run
from searchr1.core.sinks import SinkHub
from searchr1.core.step import (
    Records,
    adam_params,
    aggregation_of,
    batch_limits,
    guarded_collect,
    kept_lines,
    record,
    save,
)
from searchr1.core.step_metrics import ratio_basis
from searchr1.core.trainer_checks import loss_refusals
from searchr1.core.types import (
    Asset,
    LossFn,
    Model,
    Question,
    RewardFn,
    Sampler,
    SearchProvider,
    Trainer,
    kl_coef,
)
from searchr1.rl.job import Environment, Job
from searchr1.rl.pipeline import Window, run_steps
from searchr1.rl.step import Batch, Learned, learn


def train(run: Run, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``run.config`` in ``run``'s folder; returns the last step's metrics.
    Everything runs in one event loop: the loads first (what the config names, the model,
    the checkpoint on ``resume``), then the phases. A stop (``run.stop``: SIGINT/SIGTERM) ends
    the phase it arrives in and raises :class:`Interrupted` saying what was kept and the
    command that goes on."""
    try:
        return asyncio.run(_train(run, resume=resume))
    except Interrupted as stop:
        raise _outcome(stop, run.log, run.run_dir, run.config.source) from None


@dataclass
class _Plan:
    """What the loop reads, fixed before step 1: the algorithm's parts (``env``, ``job``,
    ``trainer``, ``loss``) and where the run keeps what it did (``records``)."""

    config: Config
    env: Environment
    job: Job
    trainer: Trainer
    records: Records
    #: the plugins' assets (a ``builtin:`` data set's ceiling agent and cold-start teacher)
    assets: Mapping[str, Asset]
    stream: QuestionStream
    health: Health
    #: rank 0's periodic held-out eval (``train.eval_every``), None when off
    periodic: PeriodicEval | None
    #: the questions of the evals "before", "cold_start" and "after" ([] when off, or off rank 0)
    heldout: list[Question]
    loss: LossFn
    #: the step the loop continues after (the checkpoint's on --resume)
    start: int
    fresh: bool
    #: ``[train.cold_start]`` and its loss (None: no cold start)
    warm_up: ColdStartSettings
    warm_up_loss: LossFn | None

    def saves(self, step: int) -> bool:
        t = self.config.train
        return step > self.start and (step % t.save_every == 0 or step == t.max_steps)

    def evaluates(self, step: int) -> bool:
        return self.periodic is not None and self.periodic.due(step, self.config.train.max_steps)


@dataclass
class _Progress:
    """What the RL steps left: the latest recorded step and its metrics, and the periodic
    eval a stop cut short."""

    batch: Batch | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)
    #: the newest step whose optimizer step is done: the weights are the ones after it
    trained: Batch | None = None
    #: the newest step checkpointed (the loop's start before any)
    saved: int = 0
    #: an optimizer step is under way: the weights are neither the old nor the new step's
    learning: bool = False

    def cut_short(self, stop: Interrupted) -> dict[str, float]:
        """A periodic eval a stop cut short: noted, no metrics (the step itself is kept)."""
        self.cut.append(stop.phase)
        return {}


async def _train(run: Run, *, resume: bool) -> dict[str, Any]:
    plan, stop = await _prepare(run, resume=resume), run.stop
    if run.run_dir is not None:  # what a second Ctrl-C keeps, until the next save
        stop.kept = "; ".join(kept(run.folder, run.config.source))
    progress = _Progress(saved=plan.start)
    try:
        if plan.fresh:
            await _before_rl(plan, progress)
        else:
            plan.job.check(f"the resume from checkpoint step {plan.start}")
        try:
            await _rl_steps(plan, progress)
        except Exception as exc:  # any stop of the RL steps keeps the last trained step
            _keep(plan, progress, failure=exc)
            raise
        step = progress.batch.step if progress.batch else plan.start
        asked = stop.asked(run.world)  # a rank that got no signal stops too
        stopped = asked is not None or plan.health.stop_alert is not None
        if stopped:
            _keep(plan, progress)
        if not stopped:
            await _final_eval(plan, step)
        # every rank closes the model at the same point, once rank 0's last save and eval
        # are done (a model may close with a collective); an error closes it at once
        run.world.gather(None)
    except SearchR1Error as exc:  # a stop: its message ends with what was kept, what goes on
        if not isinstance(exc, Interrupted):  # (a signal's: train(), once the loop is closed)
            _say_kept(run.run_dir, run.config.source, exc)
        raise
    finally:
        await _close(run.search, run.reward, run.model, run.sinks)
    return _end(plan, progress, step, asked, run.log)


#: held-out questions also in data.train, as a share of data.eval, from which a warning is
#: given: public QA splits share a few percent of their questions (NQ's train and test), a
#: mix-up of files (data.eval = data.train, swapped splits) far more
HELDOUT_IN_TRAIN_WARN = 0.05


def _warn_on_the_data(cfg: Config, train: Sequence[Question], heldout: Sequence[Question]) -> None:
    """Warn about data that looks mixed up: fewer training questions than a step draws
    (each step draws some several times), or held-out questions that are training ones
    (their held-out EM is not held out)."""
    per_step = cfg.rollout.questions_per_batch
    if len(train) < per_step:
        warn(
            "data_fewer_than_a_batch",
            f"data.train = {cfg.data.train!r} holds {len(train)} "
            f"question{'s' if len(train) != 1 else ''}, fewer than "
            f"rollout.questions_per_batch = {per_step} "
            f"({cfg.where('rollout.questions_per_batch')}): every step draws the same "
            f"questions several times over; lower questions_per_batch, or check that "
            f"data.train is the file meant",
        )
    seen = {" ".join(q.question.lower().split()) for q in train}
    shared = [q for q in heldout if " ".join(q.question.lower().split()) in seen]
    if heldout and len(shared) >= HELDOUT_IN_TRAIN_WARN * len(heldout):
        warn(
            "heldout_in_train",
            f"{len(shared)} of the {len(heldout)} held-out questions of data.eval = "
            f"{cfg.data.eval!r} are in data.train = {cfg.data.train!r} too (e.g. "
            f"{shared[0].question!r}): the held-out EM counts them as unseen; check that "
            f"data.eval is the held-out split",
        )


async def _prepare(run: Run, *, resume: bool) -> _Plan:
    """Read and check what the config names (before the slow model load), load and connect
    the model (``run.start``) and, on ``resume``, the checkpoint's state."""
    cfg, log = run.config, get_logger()
    questions = load_questions(cfg.data.train, cfg.assets, field_name="data.train", report=True)
    stream = QuestionStream(questions.questions, cfg.run.seed)
    health = Health.for_config(cfg)
    heldout = heldout_questions(cfg)
    if run.world.main:
        _warn_on_the_data(cfg, questions.questions, heldout)
    periodic = PeriodicEval.for_config(cfg, heldout) if run.world.main else None
    evaluated = heldout if run.world.main else []
    if not cfg.train.eval_before_after or not run.world.main:
        heldout = []  # eval_every's questions only; under torchrun rank 0 alone evaluates
    warm_up = cold_start_settings(cfg)
    records = Records(run.folder, run.sinks)
    checkpoint = resume_point(run.folder, cfg, run.world, stream) if resume else None
    if run.world.main:  # the one process that saves
        for stale in remove_stale_saves(run.folder):
            log.info("stale_save_removed", path=str(stale), detail="left by a killed save")
    ask = {"max_staleness": cfg.train.max_staleness, "provider": cfg.model.provider}
    check_supported(run.world, data_parallel=None, **ask)  # before the (slow) model load
    if refused := loss_refusals(cfg, run.registry):  # before a remote provider's login
        raise ConfigError(refused)
    # a remote reward (the LLM judge) is asked once now: down or rejected stops the run before
    # the model loads, not after step 1's retries
    probe = questions.questions[0] if questions.questions else None
    await run.start(need_loss=True, check=probe)
    assert run.loss is not None  # start(need_loss=True) created it
    try:
        check_supported(run.world, data_parallel=run.trainer.capabilities.data_parallel, **ask)
        # now, not at the first held-out eval: eval_every's may come hours in
        check_fit(run.protocol, evaluated, cfg.rollout.max_trajectory_tokens, "data.eval")
        warm_up_loss = (
            cold_start_loss(warm_up, cfg, run.registry, run.trainer) if warm_up.steps else None
        )
        log.info(
            "importance_ratio",
            message=ratio_basis(
                cfg.model.temperature, run.trainer.capabilities.learner_temperature
            ),
        )
        if checkpoint is not None:
            await load_model_state(run.trainer, cfg, checkpoint)
            health.load_state(checkpoint.state)
            restore_rng(checkpoint)
            records.resume(checkpoint.state.get("totals") or {})
            log.info("resumed", step=checkpoint.step, checkpoint=str(checkpoint.path))
            if periodic is not None:
                periodic.resume(run.folder)
    except BaseException:
        await run.aclose()
        raise
    start = checkpoint.step if checkpoint is not None else 0
    return _Plan(
        cfg, run.env, run.job, run.trainer, records, run.registry.assets, stream, health,
        periodic, heldout, run.loss, start, checkpoint is None, warm_up, warm_up_loss,
    )  # fmt: skip


async def _before_rl(plan: _Plan, progress: _Progress) -> None:
    """A fresh run's phases before step 1: the held-out eval "before" (and the asset's
    ceiling agent), the cold start with its eval "cold_start", the KL reference pinned and
    checkpoint 0, and the periodic eval of step 0. Every rank passes each phase (the ranks
    stop together at its boundary)."""
    cfg, job = plan.config, plan.job
    evals = cfg.train.eval_before_after and bool(cfg.data.eval)  # on rank 0
    if evals:
        await _heldout_phase(plan, "before")
        ceiling = ceiling_agent(plan.env, plan.assets) if plan.heldout else None
        if job.world.broadcast(ceiling is not None):  # rank 0's
            await _heldout_phase(plan, "ceiling", sampler=ceiling)
    if plan.warm_up_loss is not None:
        await cold_start(plan.env, job, plan.trainer, plan.assets, plan.warm_up, plan.warm_up_loss)
        if evals:
            await _heldout_phase(plan, "cold_start")
        pin_kl_reference(plan.trainer, plan.loss)  # before checkpoint 0, which saves it
        _save(plan, plan.stream.state(), 0)  # --resume starts after it
    if cfg.train.eval_every:
        await _eval_step(plan, progress, 0, plan.stream.state())  # rank 0's; {} on the others
        job.check("the held-out eval of step 0")


def _phase(name: str) -> str:
    return f'the held-out eval "{name}"'


async def _heldout_phase(plan: _Plan, name: str, *, sampler: Sampler | None = None) -> None:
    """Rank 0's held-out eval ``name`` (``sampler``: another than the model's), a phase
    every rank passes: a stop cuts it short and the ranks stop together after it."""
    folder, sinks = plan.records.folder, plan.records.sinks
    work = (
        heldout_eval(plan.env, folder, plan.heldout, name, sampler=sampler, sinks=sinks)
        if plan.heldout
        else None
    )
    await plan.job.phase(_phase(name), work, alone=True)


async def _rl_steps(plan: _Plan, progress: _Progress) -> None:
    """Steps ``start + 1 .. max_steps`` through :func:`run_steps`: the step's three
    functions, its barriers (a step that saves or evaluates) and its stop (a signal, or a
    health alert with ``on_alert = "stop"``, which rank 0 alone sees)."""
    cfg, env, job, health = plan.config, plan.env, plan.job, plan.health
    kl = kl_coef(plan.loss) > 0
    await run_steps(
        plan.start + 1,
        cfg.train.max_steps,
        max_staleness=cfg.train.max_staleness,
        collect=lambda step, version: guarded_collect(
            env, job, plan.stream, step, version, keep_degenerate=kl
        ),
        learn=lambda batch: _learn(plan, progress, batch),
        finish=lambda batch, learned, window: _finish(plan, progress, batch, learned, window),
        holds=lambda step: plan.saves(step) or plan.evaluates(step),
        stopping=lambda: job.stop.requested or health.stop_alert is not None,
        snapshot=plan.trainer.capabilities.snapshot_sampler,
        world=job.world,
    )


async def _learn(plan: _Plan, progress: _Progress, batch: Batch) -> Learned:
    """One optimizer step on ``batch``, every trajectory weighted ``1 / N`` (N: the
    batch's trajectories, degenerate ones included) and each datum by ``[train]
    loss_agg_mode`` (:func:`~searchr1.core.step.aggregation_of`)."""
    cfg = plan.config
    aggregation = aggregation_of(cfg)
    datums = batch.datums(
        cfg.train.max_datum_tokens, kl=kl_coef(plan.loss) > 0, aggregation=aggregation
    )
    scale = 1.0 / aggregation.trajectories
    progress.learning = True
    learned = await learn(
        plan.trainer,
        plan.job,
        datums,
        plan.loss,
        limits=batch_limits(cfg),
        loss_scale=scale,
        adam=adam_params(cfg),
    )
    progress.trained, progress.learning = batch, False
    return learned


async def _finish(
    plan: _Plan, progress: _Progress, batch: Batch, learned: Learned, window: Window
) -> None:
    """After a step learned: its periodic eval (when due), its record, its checkpoint (every
    ``save_every``). An eval that fails leaves the step its record (without the eval's
    numbers); the failure stands, and the stop keeps the step."""
    try:
        evaluated = await _eval_step(plan, progress, batch.step, batch.cursor)
    except Exception:
        _record(plan, progress, batch, learned, window, {})
        raise
    _record(plan, progress, batch, learned, window, evaluated)
    if plan.saves(batch.step):
        _save(plan, batch.cursor, batch.step)
        progress.saved = batch.step


def _record(
    plan: _Plan,
    progress: _Progress,
    batch: Batch,
    learned: Learned,
    window: Window,
    evaluated: dict[str, float],
) -> None:
    kl = kl_coef(plan.loss) > 0
    progress.metrics = record(
        plan.config, plan.job.world, plan.health, plan.records, batch, learned, window, evaluated,
        kl=kl,
    )  # fmt: skip
    progress.batch = batch


async def _eval_step(
    plan: _Plan, progress: _Progress, step: int, cursor: dict[str, Any]
) -> dict[str, float]:
    """The periodic held-out eval of the weights after step ``step`` (when due); a new
    best is saved as ``checkpoints/best``. A stop cuts it short (noted in ``progress``): no
    metrics, the step itself is kept."""
    periodic = plan.periodic
    if periodic is None or not plan.evaluates(step):
        return {}
    snapshot = plan.trainer.capabilities.snapshot_sampler
    if snapshot is not None and plan.config.train.max_staleness > 0:
        await snapshot()  # evaluate the newest weights, not the pinned rollout version
    metrics = await plan.job.phase(
        f"the held-out eval of step {step}",
        periodic.evaluate(plan.env, plan.records.folder, step),
        alone=True,
        on_stop=progress.cut_short,
    )
    if periodic.is_best(step):
        _save(plan, cursor, step, name=BEST, extra={"best_heldout": periodic.state()})
    return metrics or {}


async def _final_eval(plan: _Plan, step: int) -> None:
    """The held-out eval "after", once the last step is done; a resumed run whose last step
    was saved before its final eval runs it. Every rank passes it (rank 0 evaluates)."""
    cfg, world = plan.config, plan.job.world
    due = step > plan.start or not (plan.records.folder / AFTER_FILE).exists()
    evals = cfg.train.eval_before_after and bool(cfg.data.eval)
    if step == cfg.train.max_steps and evals and world.broadcast(due):
        await _heldout_phase(plan, "after")


async def _close(search: SearchProvider, reward: RewardFn, model: Model, sinks: SinkHub) -> None:
    """Close the run's async clients in the loop they were used in, then its model and
    metric sinks."""
    try:
        await search.aclose()
        await close_reward(reward)
    finally:
        await model.aclose()
        sinks.close()


def _end(
    plan: _Plan, progress: _Progress, step: int, asked: int | None, log: RunLog | None
) -> dict[str, Any]:
    """The run's last events (the console of ``log`` ends); the last step's metrics, or the
    error a stop (``asked``: its signal) or a health alert with ``on_alert = "stop"`` ends
    the run with."""
    events = get_logger()
    best = plan.periodic.summary(plan.records.folder) if plan.periodic is not None else {}
    if best:
        events.info("best_checkpoint", **best)
    alert = plan.health.stop_alert
    stopped = asked is not None or alert is not None
    totals = {**plan.records.totals, **plan.health.notices.totals()}
    events.info("train_done", steps=step, stopped_early=stopped, **totals)
    _close_console(log)
    if asked is not None:
        raise Interrupted(asked, progress.cut[0] if progress.cut else f"RL step {step} (finished)")
    if alert is not None:
        raise HealthStop(alert.kind, alert.message, step)
    return progress.metrics


#: the final held-out eval's records: a resumed run at ``max_steps`` runs it when missing
AFTER_FILE = "eval_heldout_after.jsonl"


def _close_console(log: RunLog | None) -> None:
    """The run's progress bar ends with the loop: what the command says next (the outcome,
    an error) prints below it."""
    if log is not None:
        log.close_console()


def _save(
    plan: _Plan,
    cursor: dict[str, Any],
    step: int,
    *,
    name: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """:func:`~searchr1.core.step.save` of step ``step``; a step checkpoint (no ``name``)
    becomes what a stop at once (a second Ctrl-C) says is kept."""
    path = save(
        plan.job.world, plan.trainer, plan.config, plan.records, plan.health, cursor, step,
        name=name, extra=extra,
    )  # fmt: skip
    if path is not None and name is None:  # what --resume continues from
        lines = kept_lines(plan.records.folder, plan.config.source, step, path)
        plan.job.stop.kept = "; ".join(lines)


def _keep(plan: _Plan, progress: _Progress, failure: Exception | None = None) -> None:
    """Checkpoint the newest trained step unless a checkpoint holds it already: what every
    stop of the RL steps does first (a signal, a health alert, the search guard, a remote
    service or the judge down, a refused write, a lost rank). Nothing while an optimizer
    step is under way: the weights are then neither step's, and the last checkpoint stands.
    On a ``failure`` a save that fails too (a full disk) is logged and the failure stands."""
    trained = progress.trained
    if trained is None or trained.step <= progress.saved or progress.learning:
        return
    try:
        _save(plan, trained.cursor, trained.step)
    except Exception as exc:
        if failure is None:
            raise
        get_logger().warning(
            "checkpoint_failed",
            step=trained.step,
            error=f"{type(exc).__name__}: {exc}",
            stop=f"{type(failure).__name__}: {failure}",
        )
        return
    progress.saved = trained.step


def kept(folder: Path, source: str) -> tuple[str, str]:
    """:func:`~searchr1.core.step.kept_lines` of the run ``folder``'s newest complete
    checkpoint (its config read from ``source``): what every stop of ``train`` ends its
    message with."""
    last = latest_checkpoint(folder)
    return kept_lines(folder, source, last.step if last else None, last.path if last else None)


def _say_kept(folder: Path | None, source: str, exc: SearchR1Error) -> None:
    """End ``exc``'s message (same class, same exit code) with the lines of :func:`kept` of
    the run ``folder`` (of the config ``source``); a :class:`HealthStop` already names its
    checkpoint (the CLI adds the rest)."""
    if folder is not None and not isinstance(exc, HealthStop):
        said, then = kept(folder, source)
        exc.args = (f"{exc}\nkept: {said}\n{then}",)


def _outcome(
    stop: Interrupted, log: RunLog | None, folder: Path | None, source: str
) -> Interrupted:
    """``stop`` saying what the run ``folder`` keeps (its newest complete checkpoint) and the
    command that goes on from there (of the config ``source``), below the console of
    ``log``."""
    _close_console(log)
    if folder is None:
        return stop
    last = latest_checkpoint(folder)
    get_logger().warning(
        "stopped",
        signal=signal.Signals(stop.signum).name,
        phase=stop.phase,
        checkpoint=str(last.path) if last else None,
    )
    return stop.outcome(*kept(folder, source))


def pin_kl_reference(trainer: Trainer, loss: LossFn) -> None:
    """After a cold start, the trained adapter becomes the KL term's reference policy (the
    policy as RL begins); without one the reference stays the base model."""
    pin = trainer.capabilities.kl_reference
    if pin is not None and kl_coef(loss) > 0:
        pin()
        get_logger().info("kl_reference", message="the cold-started adapter is the KL reference")
