"""One RL step: :func:`collect` (roll out, score, advantages) -> :func:`learn` (datums,
micro-batches, one optimizer step). ``N`` (the loss scale ``1 / N``) counts every trajectory
of the batch (docs/training.md, "The loss's scale"); docs/architecture.md draws the step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigValueError
from searchr1.core.metric_schema import merge
from searchr1.core.question_stream import QuestionStream, draw_fitting
from searchr1.core.rewards import score_all
from searchr1.core.step_metrics import mismatch_means
from searchr1.core.types import (
    AdamParams,
    Datum,
    LossFn,
    Question,
    SamplingParams,
    ScoredGroup,
    Trainer,
    Trajectory,
)
from searchr1.rl.advantages import (
    AdvantageSettings,
    aggregation_weight,
    batch_advantages,
    is_degenerate,
)
from searchr1.rl.batching import BatchLimits, pack_micro_batches
from searchr1.rl.datums import trajectory_to_datum
from searchr1.rl.job import Environment, Job
from searchr1.rl.rollout import derived_seed, rollout_questions, sampling_params


@dataclass
class Batch:
    """What :func:`collect` hands the learner. ``policy_version``: optimizer steps of the
    sampling weights at rollout start; ``cursor``: the data stream's state after the draws."""

    step: int
    first: list[ScoredGroup]
    groups: list[ScoredGroup]
    draws: int
    #: the step's ``search/*``, every rank's merged (the run's search guard reads them)
    search_metrics: dict[str, float]
    cursor: dict[str, Any]
    policy_version: int
    seconds: float
    #: the rank that rolled out each of ``groups``, and this process's rank
    owners: list[int]
    rank: int = 0
    #: the reward's numbers for the step (the judge's spend), every rank's merged
    reward_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def datums(
        self, max_tokens: int, *, kl: bool = False, aggregation: Aggregation | None = None
    ) -> list[Datum]:
        """The datums of the groups this rank rolled out: each trajectory with a non-zero
        advantage (every one with ``kl``: the KL term reads advantage-0 ones too) that
        ``aggregation`` does not mask, weighted as it says over the job's whole batch."""
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
    """How a step's datums are weighted (``[train] loss_agg_mode`` and its settings)."""

    mode: str = "seq-mean-token-sum"
    #: N, the step's trajectories (the ``1 / N`` of ``loss_scale``)
    trajectories: int = 1
    #: seq-mean-token-sum-norm's constant
    norm_tokens: int = 1
    #: ``[train] mask_truncated_completions``
    mask_truncated: bool = False

    def masked(self, t: Trajectory) -> bool:
        return self.mask_truncated and truncated(t)


def sampled_tokens(t: Trajectory) -> int:
    """The tokens of ``t`` the policy sampled (those a loss reads)."""
    return sum(t.generated_mask[1:])


def truncated(t: Trajectory) -> bool:
    """``t`` reached ``rollout.max_trajectory_tokens`` or its last turn ``max_new_tokens``."""
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
    """What :func:`learn` did."""

    loss: float
    #: the learners' sums and extremes merged, the ``mismatch/*`` means in place of their sums
    train_metrics: dict[str, float]
    optim: Mapping[str, float]
    seconds: float


async def collect(
    env: Environment,
    job: Job,
    stream: QuestionStream,
    step: int,
    policy_version: int,
    *,
    keep_degenerate: bool = False,
) -> Batch:
    """Roll out and score step ``step``'s groups, with their advantages (the step's search
    and reward numbers are the caller's to read). With ``rollout.dynamic_sampling`` degenerate
    groups are replaced by fresh questions until questions_per_batch are informative or
    ``rollout.max_extra_draws`` is spent; ``keep_degenerate`` (a loss with a KL term) keeps
    them all: the term anchors the skills those groups show."""
    t0, cfg = time.perf_counter(), env.config
    want = cfg.rollout.questions_per_batch
    draw = (env, job, step, policy_version)
    first, owners = await _rollout_shared(*draw, draw_fitting(env, job, stream, want), 0)
    groups = list(first)
    extra = 0
    metric = cfg.rollout.dynamic_sampling_metric
    while cfg.rollout.dynamic_sampling and extra < cfg.rollout.max_extra_draws:
        missing = want - sum(informative(g, metric) for g in groups)
        if missing <= 0:
            break
        n = min(missing, cfg.rollout.max_extra_draws - extra)
        extra += n
        more, more_owners = await _rollout_shared(*draw, draw_fitting(env, job, stream, n), extra)
        groups += more
        owners += more_owners
    if cfg.rollout.dynamic_sampling:
        keep = kept_groups(groups, want, metric, keep_degenerate)
        groups, owners = [groups[i] for i in keep], [owners[i] for i in keep]
    return Batch(
        step=step,
        first=with_advantages(cfg, first),
        groups=with_advantages(cfg, groups),
        draws=extra,
        search_metrics={},
        cursor=stream.state(),
        policy_version=policy_version,
        seconds=time.perf_counter() - t0,
        owners=owners,
        rank=job.world.rank,
    )


def informative(group: ScoredGroup, metric: str = "reward") -> bool:
    """Whether ``metric`` differs within ``group``: its reward (``"reward"``: the group is
    not degenerate) or that component of its rewards (``rollout.dynamic_sampling_metric``)."""
    if metric == "reward":
        return not group.degenerate
    values = []
    for r in group.rewards:
        if metric not in r.components:
            raise ConfigValueError(
                f"rollout.dynamic_sampling_metric = {metric!r}: the reward has no component of "
                f'that name; it has {sorted(r.components)} (or use "reward")'
            )
        values.append(r.components[metric])
    return not is_degenerate(values)


def kept_groups(
    groups: Sequence[ScoredGroup], want: int, metric: str, keep_degenerate: bool
) -> list[int]:
    """The indices of ``groups`` a dynamically sampled step trains: the first ``want``
    informative on ``metric``, then the others (all of them with ``keep_degenerate``, else
    only as many as make ``want`` groups)."""
    flags = [informative(g, metric) for g in groups]
    chosen = [i for i, f in enumerate(flags) if f][:want]
    rest = [i for i, f in enumerate(flags) if not f]
    if not keep_degenerate:
        rest = rest[: max(0, want - len(chosen))]
    return chosen + rest


async def _rollout_shared(
    env: Environment, job: Job, step: int, version: int, questions: Sequence[Question], draw: int
) -> tuple[list[ScoredGroup], list[int]]:
    """The scored groups of ``questions``, in order, and the rank that rolled out each (this
    rank's share rolled out here, the others' gathered). Each draw has a seed of its own."""
    world, cfg = job.world, env.config
    seed = derived_seed(cfg.run.seed, f"{step}/{draw}")
    shard = world.shard(questions)
    mine = await rollout_and_score(
        env,
        shard,
        group_size=cfg.rollout.group_size,
        sampling=dataclasses.replace(sampling_params(cfg, env.protocol), seed=seed),
        id_prefix=f"s{step}d{draw}/",
        version=version,
        on_group_done=job.progress(f"step {step} {'extra ' * bool(draw)}rollouts", len(shard)),
    )
    parts = world.gather(mine)
    parts[world.rank] = mine  # this rank's own objects, not copies
    return [g for part in parts for g in part], [r for r, part in enumerate(parts) for _ in part]


async def rollout_and_score(
    env: Environment,
    questions: Sequence[Question],
    *,
    group_size: int,
    sampling: SamplingParams,
    id_prefix: str,
    version: int = 0,
    on_group_done: Callable[[], None] | None = None,
) -> list[ScoredGroup]:
    """``group_size`` trajectories of each of ``questions`` from ``env.sampler`` (policy
    ``version``; the cold start's teacher), scored in one batch (a judge sends its calls
    together), advantages 0 until the step's groups are known (:func:`with_advantages`)."""
    trajectory_groups = await rollout_questions(
        env.sampler,
        env.search,
        env.protocol,
        questions,
        env.config,
        group_size=group_size,
        sampling=sampling,
        id_prefix=id_prefix,
        on_group_done=on_group_done,
    )
    groups = [
        [dataclasses.replace(t, policy_version=version) for t in sampled]
        for sampled in trajectory_groups
    ]
    results = iter(
        await score_all(
            env.reward,
            [(t, q.golden_answers) for q, g in zip(questions, groups, strict=True) for t in g],
        )
    )
    scored = []
    for question, trajectories in zip(questions, groups, strict=True):
        rewards = [next(results) for _ in trajectories]
        degenerate = is_degenerate([r.reward for r in rewards])
        zeros = tuple(0.0 for _ in trajectories)
        scored.append(ScoredGroup(question, trajectories, rewards, zeros, degenerate))
    return scored


async def learn(
    trainer: Trainer,
    job: Job,
    datums: Sequence[Datum],
    loss: LossFn,
    *,
    limits: BatchLimits,
    loss_scale: float,
    adam: AdamParams,
) -> Learned:
    """Pack ``datums`` into micro-batches under ``limits``, queue ``forward_backward`` for
    each (``loss`` scaled by ``loss_scale``) and one ``optim_step`` (none when no rank packed
    anything), then await them: a remote trainer gets the step back to back. Under torchrun
    the loss and metrics are every rank's."""
    world = job.world
    t0 = time.perf_counter()
    micro_batches = pack_micro_batches(list(datums), limits)
    queued = [
        await trainer.forward_backward(batch, loss, loss_scale=loss_scale)
        for batch in micro_batches
    ]
    # Every rank steps when any rank has datums: the trainer sums the gradients across ranks.
    optim = await trainer.optim_step(adam) if world.any(bool(micro_batches)) else {}
    results = [await result for result in queued]
    # the likelihood displacement an optimizer step measures merges with the learners' sums
    displaced = {k: float(v) for k, v in optim.items() if k.startswith("displacement/")}
    optim = {k: v for k, v in optim.items() if k not in displaced}
    mine = (sum((r.loss for r in results), 0.0), merge([r.metrics for r in results] + [displaced]))
    parts = world.gather(mine)
    return Learned(
        loss=sum(p[0] for p in parts),
        train_metrics=mismatch_means(merge([p[1] for p in parts])),
        optim=optim,
        seconds=time.perf_counter() - t0,
    )
