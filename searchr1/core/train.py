"""``searchr1 train``: the Search-R1 loop; one step is :mod:`searchr1.core.step`.

Before step 1 (not when resuming) each ``[train] stages`` plugin runs, in order; when one
trained the weights, checkpoint 0 follows. After the last step they run again. Steps run via
:func:`searchr1.core.pipeline.run_steps`; with ``train.max_staleness = k > 0`` rollouts run on
weights at most ``k`` versions old while a step trains. SIGINT/SIGTERM finish the step, save
a checkpoint and exit 130/143; ``--resume`` continues with the same data cursor and RNG states."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from searchr1.core.checkpoint import restore_rng
from searchr1.core.errors import Interrupted
from searchr1.core.logs import close_sinks, get_logger
from searchr1.core.pipeline import run_steps
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.runs import RunContext, build_components
from searchr1.core.step import Step
from searchr1.core.step_metrics import ratio_basis
from searchr1.core.step_monitors import open_monitors
from searchr1.core.types import StageRun, TrainStage


def train(ctx: RunContext, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``ctx.config``; returns the last step's metrics."""
    from searchr1.core.data import load_questions
    from searchr1.core.protocols import make_protocol
    from searchr1.core.question_stream import QuestionStream

    cfg, log = ctx.config, get_logger()
    # Data first: a bad data path should fail before the (slow) model load.
    stream = QuestionStream(
        load_questions(cfg.data.train, field_name="data.train", report=True).questions, cfg.run.seed
    )
    monitors = open_monitors(cfg, ctx.registry)  # [train] monitors, with their settings
    # stages read their data now, before the (slow) model load
    stages = ctx.registry.create_listed("train_stage", cfg.train.stages, TrainStage, cfg)
    # The checkpoint and its data cursor are checked before the (slow) model load too.
    checkpoint = resume_point(ctx, stream) if resume else None
    components = build_components(ctx)
    capabilities = components.trainer.capabilities
    protocol = make_protocol(cfg, components.model.sampler.tokenizer, ctx.registry)
    log.info(
        "importance_ratio",
        message=ratio_basis(cfg.model.temperature, capabilities.learner_temperature),
    )

    start_step = 0
    if checkpoint is not None:
        load_model_state(components, checkpoint)
        monitors.load_state(checkpoint.state)
        restore_rng(checkpoint)
        start_step = checkpoint.step
        log.info("resumed", step=start_step, checkpoint=str(checkpoint.path))

    stop = _StopFlag()
    last: dict[str, Any] = {}
    step = start_step
    try:
        with asyncio.Runner() as runner:
            c = components
            run = StageRun(
                cfg, ctx.run_dir, ctx.registry, c.model.sampler, c.trainer, c.search, c.reward,
                protocol, runner.run,
            )  # fmt: skip
            try:
                for stage in stages:
                    stage.check(run)  # e.g. a loss the trainer cannot train: before any rollout
                if checkpoint is None:
                    trained = [stage.before_steps(run) for stage in stages]
                    if any(trained):  # --resume starts after it
                        Step(c, protocol, stream, ctx, monitors, 0).save(stream.state(), 0)
                steps = Step(c, protocol, stream, ctx, monitors, start_step)
                step = runner.run(_run_steps(steps, stop))
                last = steps.last_metrics
                if step == cfg.train.max_steps and step > start_step:
                    for stage in stages:
                        stage.after_steps(run, step)
            finally:
                # An async HTTP client must be closed in the loop it was used in.
                runner.run(components.search.aclose())
    finally:
        components.model.close()
        stop.restore()
    log.info("train_done", steps=step, stopped_early=stop.requested, **monitors.totals())
    close_sinks()
    if stop.signum is not None:
        raise Interrupted(stop.signum, step, saved=step > start_step)
    return last


async def _run_steps(step: Step, stop: _StopFlag) -> int:
    """Steps ``start_step + 1 .. max_steps``; returns the last step learned."""
    cfg = step.ctx.config
    last = await run_steps(
        first=step.start_step + 1,
        last=cfg.train.max_steps,
        max_staleness=cfg.train.max_staleness,
        collect=step.collect,
        learn=step.learn,
        finish=step.finish,
        is_barrier=step.writes_checkpoint,
        stopping=lambda: stop.requested,
        snapshot=step.c.trainer.capabilities.snapshot_sampler,
    )
    if last is None:
        return step.start_step
    if stop.requested and not step.writes_checkpoint(last.step):
        step.save(last.cursor, last.step)
    return last.step


class _StopFlag:
    """SIGINT/SIGTERM ask the loop to stop after the current step (with a checkpoint); a
    second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = signum
        get_logger().warning("stop_requested", signal=signal.Signals(signum).name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
