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
weights at most ``k`` versions old while a step trains. SIGINT/SIGTERM finish the step, save a
checkpoint and exit 130/143.

Under torchrun every rank runs this loop on its share of each step
(:mod:`searchr1.core.distributed`); rank 0 alone runs the held-out evals, records and saves,
and the ranks stop together at the first step boundary after any of them got a signal."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

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


def train(run: Run, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``run.config`` in ``run``'s folder; returns the last step's metrics."""
    cfg, log = run.config, get_logger()
    # What the config names is read and checked before the (slow) model load.
    stream = QuestionStream(
        load_questions(cfg.data.train, field_name="data.train", report=True).questions, cfg.run.seed
    )
    health = Health.for_config(cfg, run.registry)
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

    async def eval_step(step: int, cursor: dict[str, Any]) -> dict[str, float]:
        """The periodic held-out eval of the weights after step ``step`` (when due); a new
        best is saved as ``checkpoints/best``."""
        if periodic is None or not evaluates(step):
            return {}
        snapshot = run.trainer.capabilities.snapshot_sampler
        if snapshot is not None and cfg.train.max_staleness > 0:
            snapshot()  # evaluate the newest weights, not the pinned rollout version
        metrics = await periodic.evaluate(run, step)
        if periodic.is_best(step):
            save(run, health, cursor, step, name=BEST, extra={"best_heldout": periodic.state()})
        return metrics

    # torchrun passes a terminal's Ctrl-C on to its workers a second time: not "at once" there
    stop = _StopFlag(second_interrupts=run.world.size == 1)
    last: dict[str, Any] = {}
    step = start
    try:
        with asyncio.Runner() as loop:
            try:
                if checkpoint is None and heldout:
                    loop.run(heldout_eval(run, heldout, "before"))
                    ceiling = ceiling_agent(run)
                    if ceiling is not None:
                        loop.run(heldout_eval(run, heldout, "ceiling", sampler=ceiling))
                if checkpoint is None and warm_up_loss is not None:
                    loop.run(cold_start(run, warm_up, warm_up_loss))
                    if heldout:
                        loop.run(heldout_eval(run, heldout, "cold_start"))
                    pin_kl_reference(run, loss)  # before checkpoint 0, which saves it
                    save(run, health, stream.state(), 0)  # --resume starts after it
                if checkpoint is None and periodic is not None:
                    loop.run(eval_step(0, stream.state()))

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
                            stop.requested = True
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
                stopped = stop.requested or health.stop_alert is not None
                if stopped and recorded and not saves(step):
                    save(run, health, recorded[0].cursor, step)
                if step == cfg.train.max_steps and step > start and heldout:
                    loop.run(heldout_eval(run, heldout, "after", step=step))
            finally:
                # An async HTTP client must be closed in the loop it was used in.
                loop.run(run.search.aclose())
                loop.run(close_reward(run.reward))
    finally:
        run.close()
        run.sinks.close()
        stop.restore()
    best = periodic.summary(run.folder) if periodic is not None else {}
    if best:
        log.info("best_checkpoint", **best)
    stopped_early = stop.requested or health.stop_alert is not None
    log.info("train_done", steps=step, stopped_early=stopped_early, **health.notices.totals())
    close_console()
    if stop.signum is not None:
        raise Interrupted(stop.signum, step, saved=step > start)
    if health.stop_alert is not None:
        raise HealthStop(health.stop_alert.kind, health.stop_alert.message, step)
    return last


def pin_kl_reference(run: Run, loss: LossFn) -> None:
    """After a cold start, the trained adapter becomes the KL term's reference policy (the
    policy as RL begins); without one the reference stays the base model."""
    pin = run.trainer.capabilities.kl_reference
    if pin is not None and kl_coef(loss) > 0:
        pin()
        get_logger().info("kl_reference", message="the cold-started adapter is the KL reference")


class _StopFlag:
    """SIGINT/SIGTERM ask the loop to stop after the current step (with a checkpoint); a
    second SIGINT interrupts at once (``second_interrupts``)."""

    def __init__(self, *, second_interrupts: bool = True) -> None:
        self.second_interrupts = second_interrupts
        self.requested = False
        self.signum: int | None = None
        self._previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested and signum == signal.SIGINT and self.second_interrupts:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = signum
        get_logger().warning("stop_requested", signal=signal.Signals(signum).name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
