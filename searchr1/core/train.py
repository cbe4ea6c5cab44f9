"""``searchr1 train``: the Search-R1 loop, readable top to bottom.

Each step::

    questions  = the next questions_per_batch from the data stream (deterministic from seed)
    groups     = rollout(questions, group_size)          all trajectories concurrently
    rewards    = reward(trajectory, golden answers)      per trajectory
    (dynamic sampling: replace degenerate groups by fresh questions, up to max_extra_draws)
    guard      : search broken this step? -> no update, back off, retry the step, or stop
    A_i        = r_i - mean(r_group)                     degenerate groups dropped
    datums     = full multi-turn sequences, advantage 0 on prompt/observation tokens
    for micro-batch in pack(datums):  forward_backward(micro-batch, loss, 1 / N)
    optim_step(adam)                                     exactly one per step
    log metrics; dump a few trajectories; checkpoint every save_every steps

N counts every trajectory of the step's batch (degenerate ones too), so dropping a group
never inflates the others' weight. SIGINT/SIGTERM finish the current step, save a checkpoint
and exit with code 130/143; ``--resume`` continues from the latest checkpoint with the same
data cursor and RNG states.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.advantages import group_advantages
from searchr1.core.batching import BatchLimits, pack_micro_batches
from searchr1.core.builtins import ceiling_agent
from searchr1.core.checkpoint import restore_rng, save_checkpoint
from searchr1.core.config import Config, plugin_settings
from searchr1.core.datums import trajectory_to_datum
from searchr1.core.errors import EnvironmentDown, Interrupted
from searchr1.core.health import (
    HealthMonitor,
    HealthSettings,
    learner_temperature,
    ratio_basis,
)
from searchr1.core.logs import close_sinks, get_logger, log_metrics, log_trajectories
from searchr1.core.resume import load_model_state, resume_point
from searchr1.core.runs import Components, RunContext, build_components
from searchr1.core.step_metrics import merge_train_metrics, prefixed, rollout_metrics
from searchr1.core.types import AdamParams, Datum, Question, RewardResult, Trajectory


@dataclass(frozen=True)
class ScoredGroup:
    question: Question
    trajectories: list[Trajectory]
    rewards: list[RewardResult]
    advantages: tuple[float, ...]
    degenerate: bool


def train(ctx: RunContext, *, resume: bool = False) -> dict[str, Any]:
    """Run the loop of ``ctx.config``; returns the last step's metrics."""
    from searchr1.core.agent_protocols import make_protocol
    from searchr1.core.data import QuestionStream, load_questions

    cfg, log = ctx.config, get_logger()
    # Data first: a bad data path should fail before the (slow) model load.
    stream = QuestionStream(
        load_questions(cfg.data.train, field_name="data.train", report=True).questions, cfg.run.seed
    )
    heldout = _heldout_questions(cfg)
    health = HealthMonitor(plugin_settings(cfg, "train", "health", HealthSettings))
    # The checkpoint and its data cursor are checked before the (slow) model load too.
    checkpoint = resume_point(ctx, stream) if resume else None
    components = build_components(ctx)
    protocol = make_protocol(cfg, components.model.tokenizer)
    log.info(
        "importance_ratio",
        message=ratio_basis(cfg.model.temperature, learner_temperature(components.model)),
    )

    start_step = 0
    if checkpoint is not None:
        load_model_state(components, checkpoint)
        health.load_state(checkpoint.state.get("health", {}))
        restore_rng(checkpoint)
        start_step = checkpoint.step
        log.info("resumed", step=start_step, checkpoint=str(checkpoint.path))

    stop = _StopFlag()
    last: dict[str, Any] = {}
    step = start_step
    try:
        with asyncio.Runner() as runner:
            try:
                if heldout and start_step == 0:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "before", step=0)
                    # The eval set's ceiling (the offline world's scripted ideal agent), when
                    # the asset it comes from offers one: same eval.
                    ideal = ceiling_agent(cfg, components.model.tokenizer, protocol)
                    if ideal is not None:
                        c = dataclasses.replace(components, model=ideal)
                        try:
                            _evaluate(runner, c, protocol, heldout, cfg, ctx, "ceiling", step=0)
                        except ValueError as exc:  # e.g. a protocol it cannot play
                            log.warning("ceiling_skipped", reason=str(exc))
                while step < cfg.train.max_steps and not stop.requested:
                    last = _train_step(
                        runner, components, protocol, stream, cfg, ctx, step + 1, health
                    )
                    step += 1
                    if (
                        step % cfg.train.save_every == 0
                        or step == cfg.train.max_steps
                        or stop.requested
                    ):
                        _save(ctx, components, stream, step, health)
                if heldout and step == cfg.train.max_steps and step > start_step:
                    _evaluate(runner, components, protocol, heldout, cfg, ctx, "after", step=step)
            finally:
                # An async HTTP client must be closed in the loop it was used in.
                runner.run(components.search.aclose())
    finally:
        components.model.close()
        stop.restore()
    log.info("train_done", steps=step, stopped_early=stop.requested)
    close_sinks()
    if stop.signum is not None:
        raise Interrupted(stop.signum, step, saved=step > start_step)
    return last


def _train_step(
    runner: asyncio.Runner,
    c: Components,
    protocol: Any,
    stream: Any,
    cfg: Config,
    ctx: RunContext,
    step: int,
    health: HealthMonitor,
) -> dict[str, Any]:
    log = get_logger()
    t_step = time.perf_counter()
    cursor = stream.state()
    for attempt in range(cfg.train.guard_max_waits + 1):
        t0 = time.perf_counter()
        first, groups, draws = _collect_groups(runner, c, protocol, stream, cfg, step)
        search_metrics = c.search.metrics(reset=True)
        broken = _environment_problem(c, search_metrics, cfg)
        if broken is None:
            break
        log.warning("guard/no_update", step=step, attempt=attempt + 1, reason=broken)
        if attempt == cfg.train.guard_max_waits:
            raise EnvironmentDown(
                f"step {step}: {broken}; no update was applied after "
                f"{cfg.train.guard_max_waits + 1} tries (train.guard_max_waits). Fix the "
                f"search environment (keys, quota, server), then rerun with --resume."
            )
        time.sleep(cfg.train.guard_backoff_seconds * (2**attempt))
        stream.load_state(cursor)  # retry the same questions
    t_rollout = time.perf_counter() - t0

    t1 = time.perf_counter()
    datums = _datums(groups, cfg)
    n_trajectories = cfg.rollout.questions_per_batch * cfg.rollout.group_size
    limits = BatchLimits(
        cfg.train.max_datum_tokens,
        cfg.train.max_micro_batch_datums,
        cfg.train.max_micro_batch_tokens,
    )
    micro_batches = pack_micro_batches(datums, limits)
    results = [
        c.model.forward_backward(batch, c.loss, loss_scale=1.0 / n_trajectories)
        for batch in micro_batches
    ]
    optim = c.model.optim_step(_adam(cfg)) if micro_batches else {}
    # Results are read only after optim_step: a remote provider returns them still in flight
    # (remote_model.provider.PendingResult) so the micro-batches and the optimizer step reach
    # the service back to back; reading one earlier would wait for it there.
    loss_total = sum((r.loss for r in results), 0.0)
    train_metrics = merge_train_metrics([r.metrics for r in results])
    t_train = time.perf_counter() - t1

    # Rollout metrics describe the policy: they come from the step's first draw of
    # questions_per_batch questions, an unbiased sample. The groups dynamic sampling keeps are
    # picked for mixed rewards, so their mean sits near the middle by construction.
    trajectories = [t for g in first for t in g.trajectories]
    rewards = [r for g in first for r in g.rewards]
    tokens = train_metrics.get("tokens", 0.0)
    health_metrics, alerts = health.observe(trajectories, rewards, train_metrics)
    metrics: dict[str, Any] = {
        **rollout_metrics(trajectories, rewards),
        **prefixed("search", search_metrics),
        "degenerate_group_rate": sum(g.degenerate for g in first) / len(first),
        "reward/trained_mean": _mean_reward(groups),
        "groups": float(len(groups)),
        "draws/extra": float(draws),
        "tokens/trained": tokens,
        "micro_batches": float(len(micro_batches)),
        "loss": loss_total,
        "ratio_mean": train_metrics.get("ratio_sum", 0.0) / tokens if tokens else 1.0,
        "clip_fraction": train_metrics.get("clipped_tokens", 0.0) / tokens if tokens else 0.0,
        **{k: v for k, v in train_metrics.items() if k.startswith("mismatch/")},
        **health_metrics,
        **{f"optim/{k}": float(v) for k, v in optim.items()},
        "time/rollout": t_rollout,
        "time/train": t_train,
        "time/step": time.perf_counter() - t_step,
    }
    log_metrics(step, metrics)
    for alert in alerts:
        log.warning("health_alert", step=step, kind=alert.kind, message=alert.message)
    _dump_trajectories(ctx.run_dir, step, groups, cfg.train.dump_trajectories)
    return metrics


def _collect_groups(
    runner: asyncio.Runner, c: Components, protocol: Any, stream: Any, cfg: Config, step: int
) -> tuple[list[ScoredGroup], list[ScoredGroup], int]:
    """Roll out and score one step's groups: ``(first draw, groups to train on, extra
    questions drawn)``. With dynamic sampling, degenerate groups are replaced by fresh
    questions until questions_per_batch groups are informative or ``rollout.max_extra_draws``
    extra questions were drawn."""
    want = cfg.rollout.questions_per_batch
    first = _rollout_and_score(runner, c, protocol, stream.next_batch(want), cfg, step, 0)
    groups = list(first)
    extra = 0
    while cfg.rollout.dynamic_sampling and extra < cfg.rollout.max_extra_draws:
        missing = want - sum(not g.degenerate for g in groups)
        if missing <= 0:
            break
        n = min(missing, cfg.rollout.max_extra_draws - extra)
        extra += n
        groups += _rollout_and_score(runner, c, protocol, stream.next_batch(n), cfg, step, extra)
    if cfg.rollout.dynamic_sampling:
        informative = [g for g in groups if not g.degenerate][:want]
        degenerate = [g for g in groups if g.degenerate]
        groups = informative + degenerate[: max(0, want - len(informative))]
    return first, groups, extra


def _mean_reward(groups: Sequence[ScoredGroup]) -> float:
    rewards = [r.reward for g in groups for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0


def _rollout_and_score(
    runner: asyncio.Runner,
    c: Components,
    protocol: Any,
    questions: Sequence[Question],
    cfg: Config,
    step: int,
    draw: int,
) -> list[ScoredGroup]:
    from searchr1.core.rollout import rollout_questions, sampling_params

    seed = _seed(cfg.run.seed, step, draw)
    sampling = dataclasses.replace(sampling_params(cfg, protocol), seed=seed)
    trajectory_groups = runner.run(
        rollout_questions(
            c.model,
            c.search,
            protocol,
            questions,
            cfg,
            group_size=cfg.rollout.group_size,
            sampling=sampling,
            id_prefix=f"s{step}d{draw}/",
        )
    )
    scored = []
    for question, trajectories in zip(questions, trajectory_groups, strict=True):
        rewards = [c.reward(t, question.golden_answers) for t in trajectories]
        adv = group_advantages(
            [r.reward for r in rewards], scale_by_std=cfg.train.scale_advantages_by_std
        )
        scored.append(ScoredGroup(question, trajectories, rewards, adv.advantages, adv.degenerate))
    return scored


def _datums(groups: Sequence[ScoredGroup], cfg: Config) -> list[Datum]:
    return [
        trajectory_to_datum(t, a, cfg.train.max_datum_tokens)
        for g in groups
        if not g.degenerate
        for t, a in zip(g.trajectories, g.advantages, strict=True)
        if a != 0.0
    ]


def _environment_problem(
    c: Components, search_metrics: dict[str, float], cfg: Config
) -> str | None:
    """Why this step's rollouts must not train the model, or None (the seed's warning:
    a reward curve means nothing when the search service was failing)."""
    if not c.search.available():
        return "the search provider is down (every key benched or the service unreachable)"
    calls = search_metrics.get("calls", 0.0)
    rate = search_metrics.get("success_rate", 1.0)
    if calls > 0 and rate < cfg.search.min_success_rate:
        return (
            f"search success rate {rate:.0%} over {int(calls)} calls is under "
            f"search.min_success_rate = {cfg.search.min_success_rate:.0%}"
        )
    return None


def _adam(cfg: Config) -> AdamParams:
    o = cfg.optimizer
    return AdamParams(
        learning_rate=o.lr,
        beta1=o.betas[0],
        beta2=o.betas[1],
        eps=o.eps,
        weight_decay=o.weight_decay,
        grad_clip_norm=o.grad_clip or None,
    )


def _seed(base: int, step: int, draw: int) -> int:
    """A sampling seed per (run seed, step, draw): rollouts do not depend on batching or on
    where a resumed run restarted."""
    digest = hashlib.sha256(f"{base}/{step}/{draw}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def _save(ctx: RunContext, c: Components, stream: Any, step: int, health: HealthMonitor) -> None:
    state = {"data": stream.state(), "health": health.state()}
    path = save_checkpoint(ctx.run_dir, step, c.model, ctx.config, state)
    get_logger().info("checkpoint", step=step, path=str(path))


def _dump_trajectories(run_dir: Path, step: int, groups: Sequence[ScoredGroup], n: int) -> None:
    if n <= 0:
        return
    from searchr1.core.eval import trajectory_to_dict

    folder = run_dir / "trajectories"
    folder.mkdir(parents=True, exist_ok=True)
    picked = [(t, r) for g in groups for t, r in zip(g.trajectories, g.rewards, strict=True)][:n]
    records = [{"step": step, **trajectory_to_dict(traj, result)} for traj, result in picked]
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
            c.model,
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
