"""The run's side of a step (the step itself, ``collect`` -> ``learn``, is
:mod:`searchr1.rl.step`): the search guard around ``collect`` (:func:`guarded_collect`),
:func:`record` (health, the ``metrics`` event, sinks, the trajectory dump) and :func:`save`
(its checkpoint), with the lines every stop of ``train`` ends with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.checkpoint import save_checkpoint
from searchr1.core.config_schema import Config
from searchr1.core.disk import atomic_write
from searchr1.core.distributed import World
from searchr1.core.errors import REMOTE_FAILURES, EnvironmentDown, RemoteError
from searchr1.core.health import Health, StepRecord
from searchr1.core.logs import get_logger, log_metrics
from searchr1.core.metric_schema import assemble, merge
from searchr1.core.question_stream import QuestionStream
from searchr1.core.rewards import decided_failure, reward_metrics, reward_problem
from searchr1.core.sinks import SinkHub
from searchr1.core.step_metrics import (
    displacement_metrics,
    kl_metrics,
    llds_metrics,
    peak_rss_gb,
    prefixed,
    ratio_metrics,
    rollout_metrics,
)
from searchr1.core.types import AdamParams, RewardResult, ScoredGroup, Trainer, Trajectory
from searchr1.rl.batching import BatchLimits
from searchr1.rl.job import Environment, Job
from searchr1.rl.pipeline import Window
from searchr1.rl.step import Aggregation, Batch, Learned, collect


async def guarded_collect(
    env: Environment,
    job: Job,
    stream: QuestionStream,
    step: int,
    policy_version: int,
    *,
    keep_degenerate: bool = False,
) -> Batch:
    """:func:`~searchr1.rl.step.collect` under the search guard: while search (or the
    reward's judge) is broken the same questions are retried after a back-off, raising
    :class:`EnvironmentDown` after ``train.guard_max_waits`` retries, or at once the
    :class:`RemoteError` of a failure no wait mends (every key rejected or benched for the
    run: :func:`_decided_failure`). The batch carries the step's search and reward numbers."""
    cfg, log, world = env.config, get_logger(), job.world
    cursor = stream.state()
    t0 = time.perf_counter()
    for attempt in range(cfg.train.guard_max_waits + 1):
        batch = await collect(
            env, job, stream, step, policy_version, keep_degenerate=keep_degenerate
        )
        search_metrics = merge(world.gather(prefixed("search", env.search.metrics(reset=True))))
        down = world.any(not env.search.available())
        broken = _environment_problem(cfg, search_metrics, down)
        fix = "search environment (keys, quota, server)"
        judged = [p for p in world.gather(reward_problem(env.reward)) if p]
        reward_numbers = merge(world.gather(reward_metrics(env.reward, reset=True)))
        if broken is None and judged:
            broken, fix = judged[0], "reward judge ([reward.judge] api_base, model, keys, quota)"
        if broken is None:
            break
        if (decided := _decided_failure(env, job, step)) is not None:  # no wait mends it
            log.warning("guard/no_update", step=step, attempt=attempt + 1, reason=broken)
            raise decided
        last = attempt == cfg.train.guard_max_waits
        wait = cfg.train.guard_backoff_seconds * (2**attempt)
        retry = {} if last else {"retry_in_s": wait}
        log.warning("guard/no_update", step=step, attempt=attempt + 1, reason=broken, **retry)
        if last:
            raise EnvironmentDown(
                f"step {step}: {broken}; no update was applied in {_guard_tries(cfg)}. Fix the "
                f"{fix}, then rerun."
            )
        # A stop ends the wait: the step has nothing to keep (it is retried from its cursor).
        await job.phase(f"the search guard's wait before retrying step {step}", asyncio.sleep(wait))
        stream.load_state(cursor)  # retry the same questions
    return dataclasses.replace(
        batch,
        search_metrics=search_metrics,
        reward_metrics=reward_numbers,
        seconds=time.perf_counter() - t0,
    )


def _guard_tries(cfg: Config) -> str:
    """``4 tries, the first and 3 after waiting 30 s, 60 s and 120 s (train.guard_max_waits =
    3)``: the count a user checks against the setting they wrote."""
    waits = cfg.train.guard_max_waits
    setting = f"train.guard_max_waits = {waits}"
    if waits == 0:
        return f"1 try ({setting})"
    times = [f"{cfg.train.guard_backoff_seconds * 2**i:g} s" for i in range(waits)]
    waited = times[0] if waits == 1 else f"{', '.join(times[:-1])} and {times[-1]}"
    return f"{waits + 1} tries, the first and {waits} after waiting {waited} ({setting})"


def _decided_failure(env: Environment, job: Job, step: int) -> RemoteError | None:
    """The failure of search or the reward that no wait mends (every key rejected or benched
    for the run) at step ``step``, the first any rank found, on every rank; None when a wait
    may mend it."""
    mine = next(filter(None, (decided_failure(env.search), decided_failure(env.reward))), None)
    said = (mine.failure, str(mine), mine.status) if mine is not None else None
    found = next((f for f in job.world.gather(said) if f is not None), None)
    if found is None:
        return None
    failure, message, status = found
    return REMOTE_FAILURES[failure](f"step {step}: {message}", status=status)


def _environment_problem(cfg: Config, search_metrics: dict[str, float], down: bool) -> str | None:
    """Why this step's rollouts must not train the model, or None (a reward curve means
    nothing when the search service was failing). ``down``: the provider (of some rank)
    reports itself unavailable."""
    if down:
        return "the search provider is down (every key benched or the service unreachable)"
    calls = search_metrics.get("search/calls", 0.0)
    rate = search_metrics.get("search/success_rate", 1.0)
    if calls > 0 and rate < cfg.search.min_success_rate:
        return (
            f"search success rate {rate:.0%} over {int(calls)} calls is under "
            f"search.min_success_rate = {cfg.search.min_success_rate:.0%}"
        )
    return None


@dataclass
class Records:
    """Where ``train`` keeps what its steps did: the run ``folder`` (checkpoints, trajectory
    dumps), the metric ``sinks``, and the run ``totals`` of the latest step
    (``search/paid_calls_total``, ...: ``train_done``'s) counted across resumes: ``before``
    holds the resumed checkpoint's, added to this process's own counts (a judge or a search
    provider counts from its start)."""

    folder: Path
    sinks: SinkHub = field(default_factory=SinkHub)
    totals: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)

    def resume(self, saved: Mapping[str, Any]) -> None:
        """Count on from a checkpoint's saved totals."""
        self.before = {str(k): float(v) for k, v in saved.items()}
        self.totals.update(self.before)

    def count(self, totals: Mapping[str, float]) -> None:
        """This process's totals so far, plus those before it."""
        self.totals.update({k: v + self.before.get(k, 0.0) for k, v in totals.items()})


def record(
    config: Config,
    world: World,
    health: Health,
    records: Records,
    batch: Batch,
    learned: Learned,
    window: Window,
    extra: Mapping[str, float] | None = None,
    *,
    kl: bool = False,
) -> dict[str, Any]:
    """Health checks, the ``metrics`` event (returned; ``extra`` joins it: the periodic
    held-out eval's ``eval/*``; ``window``: the step's, :func:`window_metrics`), alerts and
    the trajectory dump; rank 0 alone under torchrun
    (others return ``{}``). The event holds what :func:`~searchr1.core.metric_schema.assemble`
    keeps of the step's numbers; the run totals it sets apart go to ``records``
    (``train_done``). ``kl``: the loss has a KL term."""
    if not world.main:
        return {}
    log = get_logger()
    trajectories, rewards = first_draw(batch)
    timing = window_metrics(batch, window)
    health_metrics, alerts = health.observe(
        StepRecord(
            batch.step,
            batch.groups,
            trajectories,
            rewards,
            learned.train_metrics,
            timing["staleness/max"],
        )
    )
    values = {**step_metrics(batch, learned, health_metrics, timing, kl=kl), **(extra or {})}
    if world.size > 1:
        values["world_size"] = float(world.size)
    modes = ("pipelined",) if config.train.max_staleness > 0 else ()
    metrics, totals = assemble(values, modes)
    records.count(totals)
    log_metrics(batch.step, metrics)
    records.sinks.scalars(batch.step, metrics)
    for alert in alerts:
        log.warning("health_alert", step=batch.step, kind=alert.kind, message=alert.message)
    dumped = _dump_trajectories(
        records.folder, batch.step, batch.groups, config.train.dump_trajectories
    )
    records.sinks.trajectories(batch.step, dumped)
    return metrics


def save(
    world: World,
    trainer: Trainer,
    config: Config,
    records: Records,
    health: Health,
    cursor: dict[str, Any],
    step: int,
    *,
    name: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """Checkpoint ``step`` into the run folder of ``records``: ``trainer``'s state, the data
    ``cursor``, the health state and the run totals (and ``extra``), in
    ``checkpoints/<name>`` when ``name`` is given; the checkpoint's path. Rank 0 alone under
    torchrun (the adapter and optimizer are the same on every rank; the others get None)."""
    if not world.main:
        return None
    # the run totals so far: a resumed run's train_done counts the processes before it
    state = {**health.state(), "data": cursor, "totals": dict(records.totals), **(extra or {})}
    path = save_checkpoint(records.folder, step, trainer, config, state, name=name)
    get_logger().info("checkpoint", step=step, path=str(path))
    return path


def kept_lines(folder: Path, source: str, step: int | None, path: Path | None) -> tuple[str, str]:
    """What the run ``folder`` keeps (checkpoint ``step`` at ``path``, or nothing) and the
    command that goes on from there (its config read from ``source``): the two lines every
    stop of ``train`` ends with."""
    from searchr1.core.disk import resume_command

    if step is None or path is None:
        return (
            "nothing: no step was trained yet (no checkpoint)",
            f"start it again with `{resume_command(folder, source, resume=False)}`",
        )
    return (
        f"checkpoint step {step} ({path})",
        f"continue with `{resume_command(folder, source)}`",
    )


def step_metrics(
    batch: Batch,
    learned: Learned,
    health_metrics: Mapping[str, float],
    timing: Mapping[str, float],
    *,
    kl: bool = False,
) -> dict[str, Any]:
    """Every number of the step, once: what the ``metrics`` event and the run totals are
    made of (:func:`~searchr1.core.metric_schema.assemble` sorts them). Rollout metrics come
    from the first draw, an unbiased policy sample: the groups dynamic sampling keeps are
    picked for mixed rewards, so their mean sits mid-range by construction. ``timing``: the
    window metrics (``staleness/*``, ``pipeline/*``, ``time/step``); ``kl``: the loss has a
    KL term (dynamic sampling then keeps degenerate groups: ``groups`` says how many)."""
    trajectories, rewards = first_draw(batch)
    train_metrics = learned.train_metrics
    return {
        **rollout_metrics(trajectories, rewards),
        **batch.search_metrics,
        **batch.reward_metrics,
        "degenerate_group_rate": sum(g.degenerate for g in batch.first) / len(batch.first),
        "reward/trained_mean": _mean_reward(batch.groups),
        "draws/extra": float(batch.draws),
        "tokens/trained": train_metrics.get("tokens", 0.0),
        "loss": learned.loss,
        **ratio_metrics(train_metrics),
        **{k: v for k, v in train_metrics.items() if k.startswith("mismatch/")},
        **kl_metrics(train_metrics),
        **llds_metrics(train_metrics),
        **displacement_metrics(train_metrics),
        # without a KL term dynamic sampling keeps exactly questions_per_batch groups
        **({"groups": float(len(batch.groups))} if kl else {}),
        **health_metrics,
        **{f"optim/{k}": float(v) for k, v in learned.optim.items()},
        "time/rollout": batch.seconds,
        "time/train": learned.seconds,
        "memory/peak_rss_gb": peak_rss_gb(),
        **timing,
    }


def window_metrics(batch: Batch, window: Window) -> dict[str, float]:
    """The step's staleness (of its trajectories), the idle fractions of trainer and sampler
    over its window, the seconds of rollouts that overlapped learning, and ``time/step``."""
    w = window
    span = max(w.learn_end - w.start, 1e-9)
    trained_on = batch.step - 1
    stale = [trained_on - t.policy_version for g in batch.groups for t in g.trajectories] or [
        trained_on - batch.policy_version
    ]
    return {
        "staleness/mean": sum(stale) / len(stale),
        "staleness/max": float(max(stale)),
        "pipeline/trainer_idle_frac": min(
            1.0, max(0.0, 1.0 - (w.learn_end - w.learn_start) / span)
        ),
        "pipeline/sampler_idle_frac": min(1.0, max(0.0, 1.0 - w.rollout_busy / span)),
        "pipeline/overlap_s": w.overlap,
        "time/step": span,
    }


def adam_params(cfg: Config) -> AdamParams:
    """``[optimizer]`` as the provider's AdamParams (the cold start changes the lr)."""
    o = cfg.optimizer
    return AdamParams(
        learning_rate=o.lr,
        beta1=o.betas[0],
        beta2=o.betas[1],
        eps=o.eps,
        weight_decay=o.weight_decay,
        grad_clip_norm=o.grad_clip or None,
    )


def first_draw(batch: Batch) -> tuple[list[Trajectory], list[RewardResult]]:
    """The trajectories and rewards of the step's first draw (what the health checks read)."""
    trajectories = [t for g in batch.first for t in g.trajectories]
    rewards = [r for g in batch.first for r in g.rewards]
    return trajectories, rewards


def aggregation_of(cfg: Config) -> Aggregation:
    """The step's :class:`Aggregation` from ``[train]`` and ``[rollout]``."""
    return Aggregation(
        mode=cfg.train.loss_agg_mode,
        trajectories=cfg.rollout.questions_per_batch * cfg.rollout.group_size,
        norm_tokens=cfg.train.loss_agg_tokens or cfg.rollout.max_trajectory_tokens,
        mask_truncated=cfg.train.mask_truncated_completions,
    )


def batch_limits(cfg: Config) -> BatchLimits:
    """``[train]``'s micro-batch limits."""
    t = cfg.train
    return BatchLimits(t.max_datum_tokens, t.max_micro_batch_datums, t.max_micro_batch_tokens)


def _mean_reward(groups: Sequence[ScoredGroup]) -> float:
    rewards = [r.reward for g in groups for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0


def _dump_trajectories(
    run_dir: Path, step: int, groups: Sequence[ScoredGroup], n: int
) -> list[dict[str, Any]]:
    """Write the step's first ``n`` trajectories to ``trajectories/step_<step>.jsonl``."""
    if n <= 0:
        return []
    folder = run_dir / "trajectories"
    folder.mkdir(parents=True, exist_ok=True)
    picked = [(t, r) for g in groups for t, r in zip(g.trajectories, g.rewards, strict=True)][:n]
    records = [
        {"step": step, "policy_version": traj.policy_version, **traj.to_dict(result)}
        for traj, result in picked
    ]
    with atomic_write(folder / f"step_{step:06d}.jsonl") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    return records
