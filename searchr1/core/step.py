"""One training step, top to bottom: :class:`Step` ``collect`` -> ``learn`` -> ``finish``.

::

    collect  groups   = rollout(questions, group_size)        all trajectories concurrently
             rewards  = reward(trajectory, golden answers)    per trajectory
             (dynamic sampling: replace degenerate groups by fresh questions)
             guard    : search broken this step? -> back off and retry the same questions
    learn    A_i      = r_i - mean(r_group)                   degenerate groups dropped
             datums   = full multi-turn sequences, advantage 0 on prompt/observation tokens
             for micro-batch in pack(datums): forward_backward(micro-batch, loss, 1 / N)
             optim_step(adam)                                 exactly one per step
    finish   step monitors, metrics, a few trajectories dumped, checkpoint every save_every

N counts every trajectory of the batch (degenerate ones too), so dropping a group never
inflates the others' weight. :mod:`searchr1.core.pipeline` runs ``collect`` up to
``train.max_staleness`` steps ahead and ``learn`` in a worker thread, in step order."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.advantages import group_advantages
from searchr1.core.batching import BatchLimits, pack_micro_batches
from searchr1.core.checkpoint import save_checkpoint
from searchr1.core.config_schema import Config
from searchr1.core.datums import trajectory_to_datum
from searchr1.core.disk import atomic_write
from searchr1.core.errors import EnvironmentDown
from searchr1.core.logs import get_logger, log_metrics, log_trajectories
from searchr1.core.runs import Components, RunContext
from searchr1.core.step_metrics import (
    merge_train_metrics,
    peak_rss_gb,
    prefixed,
    rollout_metrics,
)
from searchr1.core.step_monitors import Monitors
from searchr1.core.types import (
    AdamParams,
    Datum,
    Question,
    RewardResult,
    ScoredGroup,
    StepRecord,
    Trajectory,
)


@dataclass
class CollectedStep:
    """What :meth:`Step.collect` hands the learner. ``policy_version``: optimizer steps of
    the sampling weights at rollout start; ``cursor``: the data stream's state after the
    step's draws (what a checkpoint after this step records)."""

    step: int
    first: list[ScoredGroup]
    groups: list[ScoredGroup]
    draws: int
    search_metrics: dict[str, float]
    cursor: dict[str, Any]
    policy_version: int
    seconds: float


@dataclass
class Learned:
    """The learner's half of a step, read by :func:`step_metrics`."""

    loss: float
    train_metrics: dict[str, float]
    optim: Mapping[str, float]
    micro_batches: int
    seconds: float


@dataclass
class Step:
    """What every step of one run shares; the scheduler calls its three methods."""

    c: Components
    protocol: Any
    stream: Any
    ctx: RunContext
    monitors: Monitors
    #: the step a resumed run starts after (0 on a fresh run)
    start_step: int
    #: the latest step's ``metrics`` event
    last_metrics: dict[str, Any] = field(default_factory=dict)

    async def collect(self, step: int, policy_version: int) -> CollectedStep:
        """Roll out and score step ``step``'s groups; while search is broken the guard
        retries the same questions after a back-off, raising :class:`EnvironmentDown` after
        ``train.guard_max_waits`` retries."""
        c, cfg, stream = self.c, self.ctx.config, self.stream
        log = get_logger()
        cursor = stream.state()
        t0 = time.perf_counter()
        for attempt in range(cfg.train.guard_max_waits + 1):
            first, groups, draws = await _collect_groups(
                c, self.protocol, stream, cfg, step, policy_version
            )
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
            await asyncio.sleep(cfg.train.guard_backoff_seconds * (2**attempt))
            stream.load_state(cursor)  # retry the same questions
        return CollectedStep(
            step=step,
            first=first,
            groups=groups,
            draws=draws,
            search_metrics=search_metrics,
            cursor=stream.state(),
            policy_version=policy_version,
            seconds=time.perf_counter() - t0,
        )

    def learn(self, collected: CollectedStep) -> Learned:
        """``forward_backward`` per micro-batch, then one ``optim_step``. Blocking: the
        scheduler runs it in a worker thread, so the next step's rollouts keep going."""
        c, cfg = self.c, self.ctx.config
        t0 = time.perf_counter()
        datums = _datums(collected.groups, cfg)
        n_trajectories = cfg.rollout.questions_per_batch * cfg.rollout.group_size
        limits = BatchLimits(
            cfg.train.max_datum_tokens,
            cfg.train.max_micro_batch_datums,
            cfg.train.max_micro_batch_tokens,
        )
        micro_batches = pack_micro_batches(datums, limits)
        trainer = c.trainer
        results = [
            trainer.forward_backward(batch, c.loss, loss_scale=1.0 / n_trajectories)
            for batch in micro_batches
        ]
        optim = trainer.optim_step(adam_params(cfg)) if micro_batches else {}
        # Read results only after optim_step: a remote trainer returns them in flight, and
        # reading one earlier would stall the micro-batches reaching the service back to back.
        loss_total = sum((r.loss for r in results), 0.0)
        train_metrics = merge_train_metrics([r.metrics for r in results])
        return Learned(
            loss=loss_total,
            train_metrics=train_metrics,
            optim=optim,
            micro_batches=len(micro_batches),
            seconds=time.perf_counter() - t0,
        )

    def finish(self, collected: CollectedStep, learned: Learned, timing: dict[str, float]) -> None:
        """Monitors, the ``metrics`` event, alerts, trajectory dump and checkpoint."""
        cfg, log = self.ctx.config, get_logger()
        trajectories, rewards = first_draw(collected)
        record = StepRecord(
            collected.step,
            collected.groups,
            trajectories,
            rewards,
            learned.train_metrics,
            timing["staleness/max"],
        )
        monitor_metrics, alerts = self.monitors.observe(record)
        metrics = {**step_metrics(collected, learned, monitor_metrics), **timing}
        log_metrics(collected.step, metrics)
        self.last_metrics.clear()
        self.last_metrics.update(metrics)
        for alert in alerts:
            log.warning("health_alert", step=collected.step, kind=alert.kind, message=alert.message)
        _dump_trajectories(
            self.ctx.run_dir, collected.step, collected.groups, cfg.train.dump_trajectories
        )
        if self.writes_checkpoint(collected.step):
            self.save(collected.cursor, collected.step)

    def writes_checkpoint(self, step: int) -> bool:
        train = self.ctx.config.train
        return step > self.start_step and (step % train.save_every == 0 or step == train.max_steps)

    def save(self, cursor: dict[str, Any], step: int) -> None:
        state = {**self.monitors.state(), "data": cursor}
        path = save_checkpoint(self.ctx.run_dir, step, self.c.trainer, self.ctx.config, state)
        get_logger().info("checkpoint", step=step, path=str(path))


def step_metrics(
    collected: CollectedStep, learned: Learned, monitor_metrics: Mapping[str, float]
) -> dict[str, Any]:
    """The step's ``metrics`` event (less ``pipeline/*`` and ``time/step``). Rollout
    metrics come from the first draw, an unbiased policy sample: the groups dynamic sampling
    keeps are picked for mixed rewards, so their mean sits mid-range by construction."""
    first, groups = collected.first, collected.groups
    trajectories = [t for g in first for t in g.trajectories]
    rewards = [r for g in first for r in g.rewards]
    train_metrics = learned.train_metrics
    tokens = train_metrics.get("tokens", 0.0)
    return {
        **rollout_metrics(trajectories, rewards),
        **prefixed("search", collected.search_metrics),
        "degenerate_group_rate": sum(g.degenerate for g in first) / len(first),
        "reward/trained_mean": _mean_reward(groups),
        "groups": float(len(groups)),
        "draws/extra": float(collected.draws),
        "tokens/trained": tokens,
        "micro_batches": float(learned.micro_batches),
        "loss": learned.loss,
        "ratio_mean": train_metrics.get("ratio_sum", 0.0) / tokens if tokens else 1.0,
        "clip_fraction": train_metrics.get("clipped_tokens", 0.0) / tokens if tokens else 0.0,
        **{k: v for k, v in train_metrics.items() if k.startswith("mismatch/")},
        **monitor_metrics,
        **{f"optim/{k}": float(v) for k, v in learned.optim.items()},
        "time/rollout": collected.seconds,
        "time/train": learned.seconds,
        "memory/peak_rss_gb": peak_rss_gb(),
    }


def first_draw(collected: CollectedStep) -> tuple[list[Trajectory], list[RewardResult]]:
    """The trajectories and rewards of the step's first draw (what the monitors read)."""
    trajectories = [t for g in collected.first for t in g.trajectories]
    rewards = [r for g in collected.first for r in g.rewards]
    return trajectories, rewards


async def _collect_groups(
    c: Components, protocol: Any, stream: Any, cfg: Config, step: int, version: int
) -> tuple[list[ScoredGroup], list[ScoredGroup], int]:
    """``(first draw, groups to train on, extra questions drawn)``: degenerate groups are
    replaced by fresh questions until questions_per_batch are informative or
    ``rollout.max_extra_draws`` is spent."""
    want = cfg.rollout.questions_per_batch
    draw = (c, protocol, cfg, step, version)
    first = await _rollout_and_score(*draw, stream.next_batch(want), 0)
    groups = list(first)
    extra = 0
    while cfg.rollout.dynamic_sampling and extra < cfg.rollout.max_extra_draws:
        missing = want - sum(not g.degenerate for g in groups)
        if missing <= 0:
            break
        n = min(missing, cfg.rollout.max_extra_draws - extra)
        extra += n
        groups += await _rollout_and_score(*draw, stream.next_batch(n), extra)
    if cfg.rollout.dynamic_sampling:
        informative = [g for g in groups if not g.degenerate][:want]
        degenerate = [g for g in groups if g.degenerate]
        groups = informative + degenerate[: max(0, want - len(informative))]
    return first, groups, extra


def _mean_reward(groups: Sequence[ScoredGroup]) -> float:
    rewards = [r.reward for g in groups for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0


async def _rollout_and_score(
    c: Components,
    protocol: Any,
    cfg: Config,
    step: int,
    version: int,
    questions: Sequence[Question],
    draw: int,
) -> list[ScoredGroup]:
    from searchr1.core.rollout import rollout_questions, sampling_params

    seed = _seed(cfg.run.seed, step, draw)
    sampling = dataclasses.replace(sampling_params(cfg, protocol), seed=seed)
    trajectory_groups = await rollout_questions(
        c.model.sampler,
        c.search,
        protocol,
        questions,
        cfg,
        group_size=cfg.rollout.group_size,
        sampling=sampling,
        id_prefix=f"s{step}d{draw}/",
    )
    scored = []
    for question, sampled in zip(questions, trajectory_groups, strict=True):
        trajectories = [dataclasses.replace(t, policy_version=version) for t in sampled]
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
    """Why this step's rollouts must not train the model, or None (a reward
    curve means nothing when the search service was failing)."""
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


def adam_params(cfg: Config) -> AdamParams:
    """``[optimizer]`` as the provider's AdamParams (a stage may change the lr)."""
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
    """A sampling seed per (run seed, step, draw), independent of batching and resumes."""
    digest = hashlib.sha256(f"{base}/{step}/{draw}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def _dump_trajectories(run_dir: Path, step: int, groups: Sequence[ScoredGroup], n: int) -> None:
    if n <= 0:
        return
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
    log_trajectories(step, records)
