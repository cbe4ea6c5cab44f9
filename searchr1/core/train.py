"""``searchr1 train``: the Search-R1 loop, readable top to bottom.

Each step (:mod:`searchr1.core.train_step`)::

    groups     = rollout(questions, group_size)          all trajectories concurrently
    rewards    = reward(trajectory, golden answers)      per trajectory
    (dynamic sampling: replace degenerate groups by fresh questions, up to max_extra_draws)
    guard      : search broken this step? -> no update, back off, retry the step, or stop
    A_i        = r_i - mean(r_group)                     degenerate groups dropped
    datums     = full multi-turn sequences, advantage 0 on prompt/observation tokens
    for micro-batch in pack(datums):  forward_backward(micro-batch, loss, 1 / N)
    optim_step(adam)                                     exactly one per step
    log metrics; dump a few trajectories; checkpoint every save_every steps

Before the first step (not when resuming): the held-out eval "before", the eval set's ceiling
where its asset offers one, and with ``[cold_start] steps > 0`` the supervised cold start
(:mod:`searchr1.core.cold_start`), its held-out eval "cold_start" and checkpoint 0.

Steps run through :func:`searchr1.core.pipeline.run_steps`: with ``train.max_staleness = 0``
one after the other; with ``k > 0`` the next steps' rollouts run (on weights at most ``k``
versions old) while this step trains. SIGINT/SIGTERM finish the current step, save a
checkpoint and exit with code 130/143; ``--resume`` continues from the latest checkpoint with
the same data cursor and RNG states.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchr1.core.builtins import ceiling_agent
from searchr1.core.checkpoint import restore_rng, save_checkpoint
from searchr1.core.cold_start import cold_start_loss, run_cold_start
from searchr1.core.config import Config, plugin_settings

# EnvironmentDown is re-exported: callers that caught it from here keep working.
from searchr1.core.errors import EnvironmentDown, Interrupted  # noqa: F401
from searchr1.core.health import HealthMonitor, HealthSettings, ratio_basis
from searchr1.core.logs import close_sinks, get_logger, log_metrics, log_trajectories
from searchr1.core.pipeline import run_steps
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.run_notices import RunNotices
from searchr1.core.runs import Components, RunContext, build_components
from searchr1.core.train_step import (
    CollectedStep,
    Learned,
    ScoredGroup,
    collect_step,
    first_draw,
    learn_step,
    step_metrics,
)
from searchr1.core.types import Model, Question


def train(ctx: RunContext, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``ctx.config``; returns the last step's metrics."""
    from searchr1.core.data import QuestionStream, load_questions
    from searchr1.core.protocols import make_protocol

    cfg, log = ctx.config, get_logger()
    # Data first: a bad data path should fail before the (slow) model load.
    stream = QuestionStream(
        load_questions(cfg.data.train, field_name="data.train", report=True).questions, cfg.run.seed
    )
    heldout = _heldout_questions(cfg)
    if cfg.cold_start.steps:
        cold_start_loss(cfg)  # an unknown [cold_start] loss_fn fails before the model load
    health = HealthMonitor(plugin_settings(cfg, "train", "health", HealthSettings))
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
        health.load_state(checkpoint.state.get("health", {}))
        restore_rng(checkpoint)
        start_step = checkpoint.step
        log.info("resumed", step=start_step, checkpoint=str(checkpoint.path))

    stop = _StopFlag()
    notices = RunNotices(cfg)  # once-per-run warnings: steps that train nothing, token limits
    last: dict[str, Any] = {}
    step = start_step
    try:
        with asyncio.Runner() as runner:
            try:
                if cfg.cold_start.steps and checkpoint is None:
                    cold_start_loss(cfg, components.trainer)  # refused before any rollout
                if heldout and checkpoint is None:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "before", step=0)
                    # The eval set's ceiling (the offline world's scripted ideal agent), when
                    # the asset it comes from offers one: same eval.
                    ideal = ceiling_agent(cfg, components.model.sampler.tokenizer, protocol)
                    if ideal is not None:
                        c = dataclasses.replace(components, model=Model(ideal))
                        try:
                            _evaluate(runner, c, protocol, heldout, cfg, ctx, "ceiling", step=0)
                        except ValueError as exc:  # e.g. a protocol it cannot play
                            log.warning("ceiling_skipped", reason=str(exc))
                if cfg.cold_start.steps and checkpoint is None:
                    run_cold_start(runner, components, protocol, cfg)
                    if heldout:
                        _evaluate(
                            runner, components, protocol, heldout, cfg, ctx, "cold_start", step=0
                        )
                    _save(ctx, components, stream.state(), 0, health)  # --resume skips it
                step = runner.run(
                    _run_steps(
                        components, protocol, stream, ctx, start_step, health, stop, last, notices
                    )
                )
                if heldout and step == cfg.train.max_steps and step > start_step:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "after", step=step)
            finally:
                # An async HTTP client must be closed in the loop it was used in.
                runner.run(components.search.aclose())
    finally:
        components.model.close()
        stop.restore()
    log.info("train_done", steps=step, stopped_early=stop.requested, **notices.totals())
    close_sinks()
    if stop.signum is not None:
        raise Interrupted(stop.signum, step, saved=step > start_step)
    return last


async def _run_steps(
    c: Components,
    protocol: Any,
    stream: Any,
    ctx: RunContext,
    start_step: int,
    health: HealthMonitor,
    stop: _StopFlag,
    last_metrics: dict[str, Any],
    notices: RunNotices,
) -> int:
    """Collect, learn, log and checkpoint steps ``start_step + 1 .. max_steps`` (stopping
    early on a signal); returns the last step learned, its metrics in ``last_metrics``."""
    cfg = ctx.config
    log = get_logger()

    def writes_checkpoint(step: int) -> bool:
        return step > start_step and (
            step % cfg.train.save_every == 0 or step == cfg.train.max_steps
        )

    def collect(step: int, version: int) -> Any:
        return collect_step(c, protocol, stream, cfg, step, version)

    def learn(collected: CollectedStep) -> Learned:
        return learn_step(c, collected, cfg)

    def finish(collected: CollectedStep, learned: Learned, timing: dict[str, float]) -> None:
        trajectories, rewards = first_draw(collected)
        health_metrics, alerts = health.observe(
            trajectories, rewards, learned.train_metrics, staleness=timing["staleness/max"]
        )
        metrics = {**step_metrics(collected, learned, health_metrics), **timing}
        log_metrics(collected.step, metrics)
        last_metrics.clear()
        last_metrics.update(metrics)
        alerts = [*alerts, *notices.observe(collected.step, collected.groups, trajectories)]
        for alert in alerts:
            log.warning("health_alert", step=collected.step, kind=alert.kind, message=alert.message)
        _dump_trajectories(
            ctx.run_dir, collected.step, collected.groups, cfg.train.dump_trajectories
        )
        if writes_checkpoint(collected.step):
            _save(ctx, c, collected.cursor, collected.step, health)

    snapshot = c.trainer.capabilities.snapshot_sampler
    last = await run_steps(
        first=start_step + 1,
        last=cfg.train.max_steps,
        max_staleness=cfg.train.max_staleness,
        collect=collect,
        learn=learn,
        finish=finish,
        is_barrier=writes_checkpoint,
        stopping=lambda: stop.requested,
        snapshot=snapshot,
    )
    if last is None:
        return start_step
    if stop.requested and not writes_checkpoint(last.step):
        _save(ctx, c, last.cursor, last.step, health)
    return last.step


def _save(
    ctx: RunContext, c: Components, cursor: dict[str, Any], step: int, health: HealthMonitor
) -> None:
    state = {"data": cursor, "health": health.state()}
    path = save_checkpoint(ctx.run_dir, step, c.trainer, ctx.config, state)
    get_logger().info("checkpoint", step=step, path=str(path))


def _dump_trajectories(run_dir: Path, step: int, groups: Sequence[ScoredGroup], n: int) -> None:
    if n <= 0:
        return
    from searchr1.core.eval import trajectory_to_dict

    folder = run_dir / "trajectories"
    folder.mkdir(parents=True, exist_ok=True)
    picked = [(t, r) for g in groups for t, r in zip(g.trajectories, g.rewards, strict=True)][:n]
    records = [
        {"step": step, "policy_version": traj.policy_version, **trajectory_to_dict(traj, result)}
        for traj, result in picked
    ]
    with (folder / f"step_{step:06d}.jsonl").open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    log_trajectories(step, records)


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
