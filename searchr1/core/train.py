"""``searchr1 train``: the Search-R1 loop, top to bottom.

::

    eval "before" (train.eval_before_after and data.eval), the asset's ceiling agent too
    cold start ([train.cold_start] steps > 0), eval "cold_start", the KL reference pinned
        ([train.loss] kl_coef > 0), checkpoint 0
    periodic eval of step 0 (train.eval_every > 0)
    for step in start + 1 .. max_steps:
        batch   = collect(...)     rollouts, rewards, advantages  (searchr1.core.step)
        learned = learn(...)       one optimizer step
        periodic eval              every eval_every steps; a new best -> checkpoints/best
        record(...)                health checks, metrics, checkpoint every save_every
        a health alert with [train.health] on_alert = "stop": checkpoint, end (exit 5)
    eval "after"

On ``--resume`` the loop continues after the checkpoint's step with the same data cursor and
RNG states; nothing before the loop runs again. With ``train.max_staleness = k > 0``
:func:`searchr1.core.pipeline.run_steps` drives the same three functions, rolling out on
weights at most ``k`` versions old while a step trains.

SIGINT/SIGTERM (``run.stop``, :mod:`searchr1.core.stop`) end the phase they arrive in: the
model load and the held-out evals at once (nothing to keep), the cold start after its current
step (its work is kept only whole, as checkpoint 0), an RL step once it is finished and
checkpointed (a periodic eval due after it is cut short); the error then names the newest
checkpoint and the command that continues (exit 130/143).

Under torchrun every rank runs this loop on its share of each step
(:mod:`searchr1.core.distributed`); rank 0 alone runs the held-out evals, records and saves,
and the ranks stop together at the first step boundary after any of them got a signal."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from searchr1.core.checkpoint import remove_stale_saves, restore_rng
from searchr1.core.cold_start import cold_start, cold_start_loss, cold_start_settings
from searchr1.core.data import load_questions
from searchr1.core.distributed import check_supported
from searchr1.core.errors import ConfigError, HealthStop, Interrupted
from searchr1.core.evaluation import (
    BEST,
    PeriodicEval,
    ceiling_agent,
    heldout_eval,
    heldout_questions,
)
from searchr1.core.health import Health
from searchr1.core.logs import close_console, get_logger
from searchr1.core.pipeline import run_steps
from searchr1.core.question_stream import QuestionStream
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.rewards import close_reward
from searchr1.core.runs import Run
from searchr1.core.step import (
    Batch,
    Learned,
    adam_params,
    collect,
    learn,
    record,
    save,
    window_metrics,
)
from searchr1.core.step_metrics import ratio_basis
from searchr1.core.trainer_checks import loss_refusals
from searchr1.core.types import LossFn, kl_coef

T = TypeVar("T")


def train(run: Run, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``run.config`` in ``run``'s folder; returns the last step's metrics.
    A stop (``run.stop``: SIGINT/SIGTERM) ends the phase it arrives in and raises
    :class:`Interrupted` saying what was kept and the command that goes on."""
    try:
        return _train(run, resume=resume)
    except Interrupted as stop:
        raise _outcome(run, stop) from None


def _train(run: Run, *, resume: bool) -> dict[str, Any]:
    cfg, log, stop = run.config, get_logger(), run.stop
    # What the config names is read and checked before the (slow) model load.
    stream = QuestionStream(
        load_questions(cfg.data.train, cfg.assets, field_name="data.train", report=True).questions,
        cfg.run.seed,
    )
    health = Health.for_config(cfg)
    heldout = heldout_questions(cfg)
    periodic = PeriodicEval.for_config(cfg, heldout) if run.world.main else None
    if not cfg.train.eval_before_after or not run.world.main:
        heldout = []  # eval_every's questions only; under torchrun rank 0 alone evaluates
    warm_up = cold_start_settings(cfg)
    checkpoint = resume_point(run, stream) if resume else None
    if run.world.main:  # the one process that saves
        for stale in remove_stale_saves(run.folder):
            log.info("stale_save_removed", path=str(stale), detail="left by a killed save")
    ask = {"max_staleness": cfg.train.max_staleness, "provider": cfg.model.provider}
    check_supported(run.world, data_parallel=None, **ask)  # before the (slow) model load
    if refused := loss_refusals(cfg, run.registry):  # before a remote provider's login
        raise ConfigError(refused)
    run.start(need_loss=True)
    loss = run.loss
    assert loss is not None  # start(need_loss=True) created it
    try:
        check_supported(run.world, data_parallel=run.trainer.capabilities.data_parallel, **ask)
    except ConfigError:
        run.close()
        raise
    warm_up_loss = cold_start_loss(run, warm_up) if warm_up.steps else None
    log.info(
        "importance_ratio",
        message=ratio_basis(cfg.model.temperature, run.trainer.capabilities.learner_temperature),
    )
    start = 0
    if checkpoint is not None:
        load_model_state(run, checkpoint)
        health.load_state(checkpoint.state)
        restore_rng(checkpoint)
        start = checkpoint.step
        log.info("resumed", step=start, checkpoint=str(checkpoint.path))
        if periodic is not None:
            periodic.resume(run.folder)

    def saves(step: int) -> bool:
        t = cfg.train
        return step > start and (step % t.save_every == 0 or step == t.max_steps)

    def evaluates(step: int) -> bool:
        return periodic is not None and periodic.due(step, cfg.train.max_steps)

    async def heldout_phase(coro: Coroutine[Any, Any, T], phase: str) -> T | None:
        """Rank 0's held-out eval ``coro``, cut short by a stop; under torchrun the cut
        eval returns None and the ranks stop together at the next boundary."""
        try:
            return await stop.cut(coro, phase)
        except Interrupted:
            if run.world.size == 1:
                raise
            return None

    async def eval_step(step: int, cursor: dict[str, Any]) -> dict[str, float]:
        """The periodic held-out eval of the weights after step ``step`` (when due); a new
        best is saved as ``checkpoints/best``. A stop cuts it short: no metrics, the
        step itself is kept."""
        if periodic is None or not evaluates(step):
            return {}
        snapshot = run.trainer.capabilities.snapshot_sampler
        if snapshot is not None and cfg.train.max_staleness > 0:
            snapshot()  # evaluate the newest weights, not the pinned rollout version
        try:
            phase = f"the held-out eval of step {step}"
            metrics = await stop.cut(periodic.evaluate(run, step), phase)
        except Interrupted as exc:
            cut.append(exc.phase)
            return {}
        if periodic.is_best(step):
            save(run, health, cursor, step, name=BEST, extra={"best_heldout": periodic.state()})
        return metrics

    last: dict[str, Any] = {}
    step = start
    cut: list[str] = []  # the periodic eval a stop cut short
    try:
        with asyncio.Runner() as loop:
            try:
                # Before RL: rank 0's evals, cut by a stop; after each phase every rank
                # checks the stop at the same boundary (the ranks stop together).
                fresh = checkpoint is None
                evals = cfg.train.eval_before_after and bool(cfg.data.eval)  # on rank 0
                if fresh and evals:
                    phase = 'the held-out eval "before"'
                    if heldout:
                        loop.run(heldout_phase(heldout_eval(run, heldout, "before"), phase))
                        ceiling = ceiling_agent(run)
                        if ceiling is not None and not stop.requested:
                            phase = 'the held-out eval "ceiling"'
                            ceiled = heldout_eval(run, heldout, "ceiling", sampler=ceiling)
                            loop.run(heldout_phase(ceiled, phase))
                    stop.check(phase, run.world)
                if fresh and warm_up_loss is not None:
                    loop.run(cold_start(run, warm_up, warm_up_loss))
                    if evals:
                        phase = 'the held-out eval "cold_start"'
                        if heldout:
                            cold = heldout_eval(run, heldout, "cold_start")
                            loop.run(heldout_phase(cold, phase))
                        stop.check(phase, run.world)
                    pin_kl_reference(run, loss)  # before checkpoint 0, which saves it
                    save(run, health, stream.state(), 0)  # --resume starts after it
                if fresh and cfg.train.eval_every:
                    loop.run(eval_step(0, stream.state()))  # rank 0's; {} on the others
                    stop.check("the held-out eval of step 0", run.world)
                if not fresh:
                    stop.check(f"the resume from checkpoint step {start}", run.world)

                adam = adam_params(cfg)
                scale = 1.0 / (cfg.rollout.questions_per_batch * cfg.rollout.group_size)

                def learn_batch(batch: Batch) -> Learned:
                    datums = batch.datums(cfg.train.max_datum_tokens, kl=kl_coef(loss) > 0)
                    return learn(run, datums, loss, loss_scale=scale, adam=adam)

                recorded: list[Batch] = []  # the latest recorded step

                async def record_step(
                    batch: Batch, learned: Learned, timing: dict[str, float]
                ) -> None:
                    evaluated = await eval_step(batch.step, batch.cursor)
                    last.clear()
                    last.update(record(run, health, batch, learned, timing, evaluated))
                    recorded[:] = [batch]
                    if saves(batch.step):
                        save(run, health, batch.cursor, batch.step)

                if cfg.train.max_staleness == 0:
                    for step in range(start + 1, cfg.train.max_steps + 1):
                        t0 = time.perf_counter()
                        batch = loop.run(collect(run, stream, step, policy_version=step - 1))
                        t1 = time.perf_counter()
                        learned = learn_batch(batch)
                        timing = window_metrics(batch, t0, t1, time.perf_counter())
                        loop.run(record_step(batch, learned, timing))
                        # rank 0 alone sees health alerts: every rank stops at the same step
                        if run.world.any(stop.requested or health.stop_alert is not None):
                            break
                else:
                    loop.run(
                        run_steps(
                            first=start + 1,
                            last=cfg.train.max_steps,
                            max_staleness=cfg.train.max_staleness,
                            collect=lambda s, v: collect(run, stream, s, v),
                            learn=learn_batch,
                            finish=record_step,
                            is_barrier=lambda s: saves(s) or evaluates(s),
                            stopping=lambda: stop.requested or health.stop_alert is not None,
                            snapshot=run.trainer.capabilities.snapshot_sampler,
                        )
                    )
                step = recorded[0].step if recorded else start
                asked = stop.asked(run.world)  # a rank that got no signal stops too
                stopped = asked is not None or health.stop_alert is not None
                if stopped and recorded and not saves(step):
                    save(run, health, recorded[0].cursor, step)
                # a resumed run whose last step was saved before its final eval runs it
                final_due = step > start or not (run.folder / AFTER_FILE).exists()
                if not stopped and step == cfg.train.max_steps and final_due and heldout:
                    after = heldout_eval(run, heldout, "after", step=step)
                    loop.run(stop.cut(after, 'the held-out eval "after"'))
            finally:
                # An async HTTP client must be closed in the loop it was used in.
                loop.run(run.search.aclose())
                loop.run(close_reward(run.reward))
    finally:
        run.close()
        run.sinks.close()
    best = periodic.summary(run.folder) if periodic is not None else {}
    if best:
        log.info("best_checkpoint", **best)
    totals = {**run.totals, **health.notices.totals()}
    log.info("train_done", steps=step, stopped_early=stopped, **totals)
    close_console()
    if asked is not None:
        raise Interrupted(asked, cut[0] if cut else f"RL step {step} (finished)")
    if health.stop_alert is not None:
        raise HealthStop(health.stop_alert.kind, health.stop_alert.message, step)
    return last


#: the final held-out eval's records: a resumed run at ``max_steps`` runs it when missing
AFTER_FILE = "eval_heldout_after.jsonl"


def _outcome(run: Run, stop: Interrupted) -> Interrupted:
    """``stop`` saying what the run folder keeps (its newest complete checkpoint) and the
    command that goes on from there."""
    from searchr1.core.checkpoint import latest_checkpoint
    from searchr1.core.disk import resume_command

    close_console()
    if run.run_dir is None:
        return stop
    last = latest_checkpoint(run.folder)
    source = run.config.source
    get_logger().warning(
        "stopped",
        signal=signal.Signals(stop.signum).name,
        phase=stop.phase,
        checkpoint=str(last.path) if last else None,
    )
    if last is None:
        return stop.outcome(
            "nothing: no checkpoint yet",
            f"start it again with `{resume_command(run.folder, source, resume=False)}`",
        )
    return stop.outcome(
        f"checkpoint step {last.step} ({last.path})",
        f"continue with `{resume_command(run.folder, source)}`",
    )


def pin_kl_reference(run: Run, loss: LossFn) -> None:
    """After a cold start, the trained adapter becomes the KL term's reference policy (the
    policy as RL begins); without one the reference stays the base model."""
    pin = run.trainer.capabilities.kl_reference
    if pin is not None and kl_coef(loss) > 0:
        pin()
        get_logger().info("kl_reference", message="the cold-started adapter is the KL reference")
