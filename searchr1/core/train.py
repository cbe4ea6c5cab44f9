"""``searchr1 train``: the Search-R1 loop; one step is :mod:`searchr1.core.step`.

Before step 1 (not when resuming): held-out eval "before", the eval asset's ceiling, and with
``[cold_start] steps > 0`` the cold start, eval "cold_start" and checkpoint 0. Steps run via
:func:`searchr1.core.pipeline.run_steps`; with ``train.max_staleness = k > 0`` rollouts run on
weights at most ``k`` versions old while a step trains. SIGINT/SIGTERM finish the step, save
a checkpoint and exit 130/143; ``--resume`` continues with the same data cursor and RNG states."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Sequence
from typing import Any

from searchr1.core.builtins import ceiling_agent
from searchr1.core.checkpoint import restore_rng
from searchr1.core.cold_start import cold_start_loss, run_cold_start
from searchr1.core.config_schema import Config
from searchr1.core.errors import Interrupted
from searchr1.core.logs import close_sinks, get_logger
from searchr1.core.pipeline import run_steps
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.runs import Components, RunContext, build_components
from searchr1.core.step import Step
from searchr1.core.step_metrics import ratio_basis
from searchr1.core.step_monitors import open_monitors
from searchr1.core.types import Model, Question


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
    heldout = _heldout_questions(cfg)
    monitors = open_monitors(cfg, ctx.registry)  # [train] monitors, with their settings
    # The checkpoint and its data cursor are checked before the (slow) model load too.
    checkpoint = resume_point(ctx, stream) if resume else None
    components = build_components(ctx)
    capabilities = components.trainer.capabilities
    protocol = make_protocol(cfg, components.model.sampler.tokenizer)
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
            try:
                if cfg.cold_start.steps and checkpoint is None:
                    # refused before any rollout when the trainer cannot train it
                    cold_loss = cold_start_loss(cfg, ctx.registry, components.trainer)
                if heldout and checkpoint is None:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "before", step=0)
                    # The eval asset's scripted agent (Asset.ceiling): the reachable ceiling.
                    ideal = ceiling_agent(cfg, components.model.sampler.tokenizer, protocol)
                    if ideal is not None:
                        c = dataclasses.replace(components, model=Model(ideal))
                        try:
                            _evaluate(runner, c, protocol, heldout, cfg, ctx, "ceiling", step=0)
                        except ValueError as exc:  # e.g. a protocol it cannot play
                            log.warning("ceiling_skipped", reason=str(exc))
                if cfg.cold_start.steps and checkpoint is None:
                    run_cold_start(runner, components, protocol, cfg, cold_loss)
                    if heldout:
                        _evaluate(
                            runner, components, protocol, heldout, cfg, ctx, "cold_start", step=0
                        )
                    Step(components, protocol, stream, ctx, monitors, 0).save(
                        stream.state(), 0
                    )  # --resume skips it
                steps = Step(components, protocol, stream, ctx, monitors, start_step)
                step = runner.run(_run_steps(steps, stop))
                last = steps.last_metrics
                if heldout and step == cfg.train.max_steps and step > start_step:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "after", step=step)
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


def _heldout_questions(cfg: Config) -> list[Question]:
    if not (cfg.train.eval_before_after and cfg.data.eval):
        return []
    from searchr1.core.data import load_questions

    return list(load_questions(cfg.data.eval, field_name="data.eval", report=True).questions)


def _evaluate(
    runner: asyncio.Runner,
    c: Components,
    protocol: Any,
    questions: Sequence[Question],
    cfg: Config,
    ctx: RunContext,
    when: str,
    step: int,
) -> None:
    from searchr1.core.eval import evaluate_async, write_records

    t0 = time.perf_counter()
    result = runner.run(
        evaluate_async(
            c.model.sampler,
            c.search,
            protocol,
            c.reward,
            questions,
            cfg,
            label=f"heldout-{when}",
            on_progress=lambda done, total: get_logger().info(
                "progress", task=f"held-out eval {when}", done=done, total=total
            ),
        )
    )
    c.search.metrics(reset=True)  # eval searches are not a training step's
    m = result.metrics
    write_records(ctx.run_dir / f"eval_heldout_{when}.jsonl", result)
    per_source = {
        f"em/{source}": float(v.get("em", 0.0)) for source, v in m.get("per_source", {}).items()
    }
    get_logger().info(
        "eval/heldout_em",
        when=when,
        step=step,
        value=m["em"],
        f1=m.get("f1"),
        format_rate=m.get("format_rate"),
        search_calls_mean=m.get("search_calls_mean"),
        search_success_rate=m.get("search_success_rate"),
        n=m.get("n"),
        seconds=round(time.perf_counter() - t0, 2),
        **per_source,
    )


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
