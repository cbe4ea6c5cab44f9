"""One training step, top to bottom: ``collect`` -> ``learn`` -> ``record``.

docs/architecture.md, "The life of a step", draws it; ``N`` (the loss scale ``1 / N``) counts
every trajectory of the batch (docs/training.md, "The loss's scale").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.advantages import (
    AdvantageSettings,
    aggregation_weight,
    batch_advantages,
    is_degenerate,
)
from searchr1.core.batching import BatchLimits, pack_micro_batches
from searchr1.core.checkpoint import save_checkpoint
from searchr1.core.config_schema import Config
from searchr1.core.datums import trajectory_to_datum
from searchr1.core.disk import atomic_write
from searchr1.core.errors import REMOTE_FAILURES, EnvironmentDown, RemoteError
from searchr1.core.health import Health, StepRecord
from searchr1.core.logs import get_logger, log_metrics
from searchr1.core.metric_schema import assemble, merge
from searchr1.core.question_stream import QuestionStream
from searchr1.core.rewards import decided_failure, reward_metrics, reward_problem, score_all
from searchr1.core.rollout import draw_fitting
from searchr1.core.runs import Run
from searchr1.core.step_metrics import (
    displacement_metrics,
    kl_metrics,
    llds_metrics,
    merge_train_metrics,
    mismatch_means,
    peak_rss_gb,
    prefixed,
    ratio_metrics,
    rollout_metrics,
)
from searchr1.core.types import (
    AdamParams,
    Datum,
    LossFn,
    Question,
    RewardResult,
    ScoredGroup,
    Trajectory,
    kl_coef,
)


@dataclass
class Batch:
    """What :func:`collect` hands the learner. ``policy_version``: optimizer steps of the
    sampling weights at rollout start; ``cursor``: the data stream's state after the step's
    draws (what a checkpoint after this step records)."""

    step: int
    first: list[ScoredGroup]
    groups: list[ScoredGroup]
    draws: int
    #: the search provider's numbers for the step (``search/*``), every rank's merged
    search_metrics: dict[str, float]
    cursor: dict[str, Any]
    policy_version: int
    seconds: float
    #: the rank that rolled out each of ``groups``
    owners: list[int]
    #: this process's rank (torchrun; 0 in one process)
    rank: int = 0
    #: the reward's numbers for the step (:func:`~searchr1.core.rewards.reward_metrics`:
    #: the judge's spend), every rank's summed
    reward_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def datums(
        self, max_tokens: int, *, kl: bool = False, aggregation: Aggregation | None = None
    ) -> list[Datum]:
        """The trained sequences of the groups this rank rolled out: each trajectory with a
        non-zero advantage, or with ``kl`` (a loss with a KL term) every trajectory, since
        the KL term reads the sampled tokens of advantage-0 ones too; none that
        ``aggregation`` masks as truncated. Each weighted as ``aggregation`` says (over the
        whole job's batch; weight 1 without one)."""
        agg = aggregation or Aggregation()
        kept = [t for g in self.groups for t in g.trajectories if not agg.masked(t)]
        batch_tokens = sum(sampled_tokens(t) for t in kept)
        return [
            dataclasses.replace(
                trajectory_to_datum(t, a, max_tokens),
                weight=aggregation_weight(
                    agg.mode,
                    sampled_tokens(t),
                    trajectories=agg.trajectories,
                    batch_tokens=batch_tokens,
                    norm_tokens=agg.norm_tokens,
                ),
            )
            for g, owner in zip(self.groups, self.owners, strict=True)
            if owner == self.rank
            for t, a in zip(g.trajectories, g.advantages, strict=True)
            if (kl or a != 0.0) and not agg.masked(t)
        ]


@dataclass(frozen=True)
class Aggregation:
    """How a step's datums are weighted (``[train]``; :func:`aggregation_of`)."""

    mode: str = "seq-mean-token-sum"
    #: N, the step's trajectories (the ``1 / N`` of ``loss_scale``)
    trajectories: int = 1
    #: seq-mean-token-sum-norm's constant
    norm_tokens: int = 1
    #: ``[train] mask_truncated_completions``
    mask_truncated: bool = False

    def masked(self, t: Trajectory) -> bool:
        return self.mask_truncated and truncated(t)


def aggregation_of(cfg: Config) -> Aggregation:
    """The step's :class:`Aggregation` from ``[train]`` and ``[rollout]``."""
    return Aggregation(
        mode=cfg.train.loss_agg_mode,
        trajectories=cfg.rollout.questions_per_batch * cfg.rollout.group_size,
        norm_tokens=cfg.train.loss_agg_tokens or cfg.rollout.max_trajectory_tokens,
        mask_truncated=cfg.train.mask_truncated_completions,
    )


def sampled_tokens(t: Trajectory) -> int:
    """The tokens of ``t`` the policy sampled (those a loss reads)."""
    return sum(t.generated_mask[1:])


def truncated(t: Trajectory) -> bool:
    """``t`` was cut by a limit: it reached ``rollout.max_trajectory_tokens``, or its last turn
    stopped at ``model.max_new_tokens`` (``[train] mask_truncated_completions``)."""
    return t.end_reason == "token_limit" or bool(t.turns and t.turns[-1].stop_reason == "length")


def with_advantages(cfg: Config, groups: Sequence[ScoredGroup]) -> list[ScoredGroup]:
    """``groups`` with the advantages of ``[train] advantage_estimator`` over all of them."""
    if not groups:
        return []
    settings = AdvantageSettings(
        "group" if cfg.train.scale_advantages_by_std else cfg.train.scale_rewards,
        cfg.train.advantage_eps,
    )
    advantages = batch_advantages(
        cfg.train.advantage_estimator,
        [[r.reward for r in g.rewards] for g in groups],
        [[sampled_tokens(t) for t in g.trajectories] for g in groups],
        settings,
    )
    return [dataclasses.replace(g, advantages=a) for g, a in zip(groups, advantages, strict=True)]


@dataclass
class Learned:
    """What :func:`learn` did, read by :func:`step_metrics`."""

    loss: float
    #: the learners' sums and extremes (``tokens``, ``ratio_sum``, ``mismatch/ratio_max``, ...),
    #: merged once, with the ``mismatch/*`` means in place of their sums
    #: (:func:`~searchr1.core.step_metrics.mismatch_means`)
    train_metrics: dict[str, float]
    optim: Mapping[str, float]
    seconds: float


async def collect(run: Run, stream: QuestionStream, step: int, policy_version: int) -> Batch:
    """Roll out and score step ``step``'s groups; while search (or the reward's judge) is
    broken the guard retries the same questions after a back-off, raising
    :class:`EnvironmentDown` after ``train.guard_max_waits`` retries, or at once the
    :class:`RemoteError` of a failure no wait mends (every key rejected or benched for the
    run: :func:`_decided_failure`)."""
    cfg, log, world = run.config, get_logger(), run.world
    cursor = stream.state()
    t0 = time.perf_counter()
    for attempt in range(cfg.train.guard_max_waits + 1):
        first, groups, owners, draws = await _collect_groups(run, stream, step, policy_version)
        search_metrics = merge(world.gather(prefixed("search", run.search.metrics(reset=True))))
        down = world.any(not run.search.available())
        broken = _environment_problem(run, search_metrics, down)
        fix = "search environment (keys, quota, server)"
        judged = [p for p in world.gather(reward_problem(run.reward)) if p]
        reward_numbers = merge(world.gather(reward_metrics(run.reward, reset=True)))
        if broken is None and judged:
            broken, fix = judged[0], "reward judge ([reward.judge] api_base, model, keys, quota)"
        if broken is None:
            break
        if (decided := _decided_failure(run, step)) is not None:  # no wait mends it: stop now
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
        # Under torchrun every rank waits it out and they stop together after it.
        phase = f"the search guard's wait before retrying step {step}"
        pause = asyncio.sleep(wait)
        await (run.stop.cut(pause, phase) if world.size == 1 else pause)
        run.stop.check(phase, world)
        stream.load_state(cursor)  # retry the same questions
    return Batch(
        step=step,
        first=first,
        groups=groups,
        draws=draws,
        search_metrics=search_metrics,
        cursor=stream.state(),
        policy_version=policy_version,
        seconds=time.perf_counter() - t0,
        owners=owners,
        rank=world.rank,
        reward_metrics=reward_numbers,
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


async def learn(
    run: Run, datums: Sequence[Datum], loss: LossFn, *, loss_scale: float, adam: AdamParams
) -> Learned:
    """Pack ``datums`` into micro-batches, queue ``forward_backward`` for each with ``loss``
    scaled by ``loss_scale`` and then one ``optim_step`` (none when no rank packed
    anything), and await the results: a remote trainer gets the whole step back to back.
    Under torchrun the loss and metrics are every rank's."""
    cfg, world = run.config, run.world
    t0 = time.perf_counter()
    limits = BatchLimits(
        cfg.train.max_datum_tokens,
        cfg.train.max_micro_batch_datums,
        cfg.train.max_micro_batch_tokens,
    )
    micro_batches = pack_micro_batches(list(datums), limits)
    trainer = run.trainer
    queued = [
        await trainer.forward_backward(batch, loss, loss_scale=loss_scale)
        for batch in micro_batches
    ]
    # Every rank steps when any rank has datums: the trainer sums the gradients across ranks.
    optim = await trainer.optim_step(adam) if world.any(bool(micro_batches)) else {}
    results = [await result for result in queued]
    # a trainer's likelihood displacement (its optimizer step measures it) merges like the
    # learner's sums, every rank's
    displaced = {k: float(v) for k, v in optim.items() if k.startswith("displacement/")}
    optim = {k: v for k, v in optim.items() if k not in displaced}
    mine = (
        sum((r.loss for r in results), 0.0),
        merge_train_metrics([r.metrics for r in results] + [displaced]),
    )
    parts = world.gather(mine)
    return Learned(
        loss=sum(p[0] for p in parts),
        train_metrics=mismatch_means(
            merge_train_metrics([p[1] for p in parts]) if len(parts) > 1 else mine[1]
        ),
        optim=optim,
        seconds=time.perf_counter() - t0,
    )


def record(
    run: Run,
    health: Health,
    batch: Batch,
    learned: Learned,
    timing: Mapping[str, float],
    extra: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Health checks, the ``metrics`` event (returned; ``extra`` joins it: the periodic
    held-out eval's ``eval/*``), alerts and the trajectory dump; rank 0 alone under torchrun
    (others return ``{}``). The event holds what :func:`~searchr1.core.metric_schema.assemble`
    keeps of the step's numbers; the run totals it sets apart go to ``run.totals``
    (``train_done``)."""
    if not run.world.main:
        return {}
    cfg, log = run.config, get_logger()
    trajectories, rewards = first_draw(batch)
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
    kl = run.loss is not None and kl_coef(run.loss) > 0
    values = {**step_metrics(batch, learned, health_metrics, timing, kl=kl), **(extra or {})}
    if run.world.size > 1:
        values["world_size"] = float(run.world.size)
    modes = ("pipelined",) if cfg.train.max_staleness > 0 else ()
    metrics, totals = assemble(values, modes)
    before = run.totals_before
    run.totals.update({key: value + before.get(key, 0.0) for key, value in totals.items()})
    log_metrics(batch.step, metrics)
    run.sinks.scalars(batch.step, metrics)
    for alert in alerts:
        log.warning("health_alert", step=batch.step, kind=alert.kind, message=alert.message)
    records = _dump_trajectories(run.folder, batch.step, batch.groups, cfg.train.dump_trajectories)
    run.sinks.trajectories(batch.step, records)
    return metrics


def save(
    run: Run,
    health: Health,
    cursor: dict[str, Any],
    step: int,
    *,
    name: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Checkpoint ``step``: the trainer's state, the data cursor and the health state (and
    ``extra``), in ``checkpoints/<name>`` when ``name`` is given; rank 0 alone under torchrun
    (the adapter and optimizer are the same on every rank)."""
    if not run.world.main:
        return
    # the run totals so far: a resumed run's train_done counts the processes before it
    state = {**health.state(), "data": cursor, "totals": dict(run.totals), **(extra or {})}
    path = save_checkpoint(run.folder, step, run.trainer, run.config, state, name=name)
    get_logger().info("checkpoint", step=step, path=str(path))
    if name is None:  # what --resume continues from
        run.stop.kept = kept_note(run, step, path)


def kept_lines(run: Run, step: int | None, path: Path | None) -> tuple[str, str]:
    """What the run folder keeps (checkpoint ``step`` at ``path``, or nothing) and the command
    that goes on from there: the two lines every stop of ``train`` ends with."""
    from searchr1.core.disk import resume_command

    source = run.config.source
    if step is None or path is None:
        return (
            "nothing: no step was trained yet (no checkpoint)",
            f"start it again with `{resume_command(run.folder, source, resume=False)}`",
        )
    return (
        f"checkpoint step {step} ({path})",
        f"continue with `{resume_command(run.folder, source)}`",
    )


def kept_note(run: Run, step: int | None, path: Path | None) -> str:
    """:func:`kept_lines` on one line: what a stop at once (a second Ctrl-C) says."""
    return "; ".join(kept_lines(run, step, path))


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


def window_metrics(
    batch: Batch,
    start: float,
    learn_start: float,
    learn_end: float,
    *,
    rollout_busy: float | None = None,
    overlap: float = 0.0,
) -> dict[str, float]:
    """The step's window, from ``start`` (the end of the previous step) to the end of this
    step's learning: staleness of its trajectories, idle fractions of trainer and sampler
    (``rollout_busy``: seconds of rollouts in the window, by default all of ``start`` to
    ``learn_start``), seconds of rollouts that overlapped learning, and ``time/step``."""
    if rollout_busy is None:
        rollout_busy = learn_start - start
    window = max(learn_end - start, 1e-9)
    trained_on = batch.step - 1
    stale = [trained_on - t.policy_version for g in batch.groups for t in g.trajectories] or [
        trained_on - batch.policy_version
    ]
    return {
        "staleness/mean": sum(stale) / len(stale),
        "staleness/max": float(max(stale)),
        "pipeline/trainer_idle_frac": min(1.0, max(0.0, 1.0 - (learn_end - learn_start) / window)),
        "pipeline/sampler_idle_frac": min(1.0, max(0.0, 1.0 - rollout_busy / window)),
        "pipeline/overlap_s": overlap,
        "time/step": window,
    }


def first_draw(batch: Batch) -> tuple[list[Trajectory], list[RewardResult]]:
    """The trajectories and rewards of the step's first draw (what the health checks read)."""
    trajectories = [t for g in batch.first for t in g.trajectories]
    rewards = [r for g in batch.first for r in g.rewards]
    return trajectories, rewards


async def _collect_groups(
    run: Run, stream: QuestionStream, step: int, version: int
) -> tuple[list[ScoredGroup], list[ScoredGroup], list[int], int]:
    """``(first draw, groups to train on, the rank of each, extra questions drawn)``:
    degenerate groups are replaced by fresh questions until questions_per_batch are
    informative or ``rollout.max_extra_draws`` is spent. A loss with a KL term keeps every
    degenerate group: the term anchors the skills those groups show."""
    cfg = run.config
    keep_degenerate = run.loss is not None and kl_coef(run.loss) > 0
    want = cfg.rollout.questions_per_batch
    draw = (run, step, version)
    first, owners = await _rollout_shared(*draw, draw_fitting(run, stream, want), 0)
    groups = list(first)
    extra = 0
    while cfg.rollout.dynamic_sampling and extra < cfg.rollout.max_extra_draws:
        missing = want - sum(not g.degenerate for g in groups)
        if missing <= 0:
            break
        n = min(missing, cfg.rollout.max_extra_draws - extra)
        extra += n
        more, more_owners = await _rollout_shared(*draw, draw_fitting(run, stream, n), extra)
        groups += more
        owners += more_owners
    if cfg.rollout.dynamic_sampling:
        informative = [i for i, g in enumerate(groups) if not g.degenerate][:want]
        degenerate = [i for i, g in enumerate(groups) if g.degenerate]
        if not keep_degenerate:
            degenerate = degenerate[: max(0, want - len(informative))]
        keep = informative + degenerate
        groups, owners = [groups[i] for i in keep], [owners[i] for i in keep]
    return with_advantages(cfg, first), with_advantages(cfg, groups), owners, extra


async def _rollout_shared(
    run: Run, step: int, version: int, questions: Sequence[Question], draw: int
) -> tuple[list[ScoredGroup], list[int]]:
    """The scored groups of ``questions``, in order, and the rank that rolled out each: this
    rank rolls out its share (:meth:`~searchr1.core.distributed.World.shard`) and gathers
    the others'."""
    world = run.world
    mine = await _rollout_and_score(run, step, version, world.shard(questions), draw)
    parts = world.gather(mine)
    parts[world.rank] = mine  # this rank's own objects, not copies
    return [g for part in parts for g in part], [r for r, part in enumerate(parts) for _ in part]


class _GroupsDone:
    """``progress`` events of one draw's rollouts (groups done of ``total``), once the draw
    has run :data:`PROGRESS_AFTER_S`, then at most one a second and the last: a step of a few
    seconds shows none, a long one (a real model) shows how far its rollouts are."""

    def __init__(self, task: str, total: int) -> None:
        self.task, self.total, self.done = task, total, 0
        self.start = self.last = time.perf_counter()

    def __call__(self) -> None:
        self.done, now = self.done + 1, time.perf_counter()
        if now - self.start < PROGRESS_AFTER_S or (self.done < self.total and now - self.last < 1):
            return
        self.last = now
        get_logger().info("progress", task=self.task, done=self.done, total=self.total)


#: seconds a draw's rollouts run before its progress shows
PROGRESS_AFTER_S = 2.0


def _mean_reward(groups: Sequence[ScoredGroup]) -> float:
    rewards = [r.reward for g in groups for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0


async def _rollout_and_score(
    run: Run,
    step: int,
    version: int,
    questions: Sequence[Question],
    draw: int,
) -> list[ScoredGroup]:
    from searchr1.core.rollout import derived_seed, rollout_questions, sampling_params

    cfg = run.config
    seed = derived_seed(cfg.run.seed, f"{step}/{draw}")  # a sampling seed per step and draw
    sampling = dataclasses.replace(sampling_params(cfg, run.protocol), seed=seed)
    task = f"step {step} rollouts" if draw == 0 else f"step {step} extra rollouts"
    trajectory_groups = await rollout_questions(
        run.sampler,
        run.search,
        run.protocol,
        questions,
        cfg,
        group_size=cfg.rollout.group_size,
        sampling=sampling,
        id_prefix=f"s{step}d{draw}/",
        on_group_done=_GroupsDone(task, len(questions)),
    )
    groups = [
        [dataclasses.replace(t, policy_version=version) for t in sampled]
        for sampled in trajectory_groups
    ]
    # every trajectory of the draw in one batch: a judge sends its calls together
    results = iter(
        await score_all(
            run.reward,
            [(t, q.golden_answers) for q, g in zip(questions, groups, strict=True) for t in g],
        )
    )
    scored = []
    for question, trajectories in zip(questions, groups, strict=True):
        rewards = [next(results) for _ in trajectories]
        degenerate = is_degenerate([r.reward for r in rewards])
        # advantages are the batch's (with_advantages, once the step's groups are known)
        zeros = tuple(0.0 for _ in trajectories)
        scored.append(ScoredGroup(question, trajectories, rewards, zeros, degenerate))
    return scored


def _decided_failure(run: Run, step: int) -> RemoteError | None:
    """The failure of search or the reward that no wait mends (every key rejected or benched
    for the run) at step ``step``, the first any rank found, on every rank; None when a wait
    may mend it."""
    mine = next(filter(None, (decided_failure(run.search), decided_failure(run.reward))), None)
    said = (mine.failure, str(mine), mine.status) if mine is not None else None
    found = next((f for f in run.world.gather(said) if f is not None), None)
    if found is None:
        return None
    failure, message, status = found
    return REMOTE_FAILURES[failure](f"step {step}: {message}", status=status)


def _environment_problem(run: Run, search_metrics: dict[str, float], down: bool) -> str | None:
    """Why this step's rollouts must not train the model, or None (a reward
    curve means nothing when the search service was failing). ``down``: the provider (of
    some rank) reports itself unavailable."""
    cfg = run.config
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
