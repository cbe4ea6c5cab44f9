"""The cold start: supervised fine-tuning of the LoRA on scripted search trajectories, before
RL, on fresh runs with ``[train.cold_start] steps > 0`` (``train`` calls it before step 1).

An instruct model asked to use a search tool usually never does, so every RL group is
degenerate and GRPO gets no signal. docs/training.md
says when it runs and what it keeps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from searchr1.core.assets import asset_name, is_builtin
from searchr1.core.config_schema import ColdStartSettings, Config
from searchr1.core.config_validate import plugin_settings
from searchr1.core.data import load_questions
from searchr1.core.logs import get_logger
from searchr1.core.plugins import Registry
from searchr1.core.question_stream import QuestionStream, draw_fitting
from searchr1.core.scripted import ScriptedTeacher
from searchr1.core.step import adam_params, batch_limits
from searchr1.core.step_metrics import peak_rss_gb
from searchr1.core.trainer_checks import check_loss
from searchr1.core.types import Asset, Datum, LossFn, Question, Sampler, Trainer
from searchr1.rl.datums import trajectory_to_datum
from searchr1.rl.job import Environment, Job
from searchr1.rl.rollout import sampling_params
from searchr1.rl.step import learn, rollout_and_score


@dataclasses.dataclass(frozen=True)
class ColdStartResult:
    """What the cold start did, for the ``cold_start_done`` event and the benchmark."""

    steps: int
    trajectories: int
    kept: int
    tokens: float
    loss_first: float
    loss_last: float
    seconds: float


def cold_start_settings(config: Config) -> ColdStartSettings:
    """``[train.cold_start]``, checked (read before the model loads)."""
    return plugin_settings(config, "train", "cold_start", ColdStartSettings)


def cold_start_loss(
    cs: ColdStartSettings, config: Config, registry: Registry, trainer: Trainer
) -> LossFn:
    """The loss ``train.cold_start.loss_fn`` names (created from ``registry``), refused
    unless ``trainer`` can train it (before any rollout, so a bad name never costs an eval)."""
    loss = registry.create("loss_fn", cs.loss_fn, config)
    check_loss(
        trainer.capabilities,
        loss,
        field="train.cold_start.loss_fn",
        provider=config.model.provider,
    )
    return loss


def teacher_for(
    config: Config,
    tokenizer: Any,
    protocol: Any,
    spec: str,
    questions: list[Question],
    assets: Mapping[str, Asset],
) -> Sampler:
    """The ``Asset.ceiling`` agent of ``spec``'s ``builtin:`` asset for this protocol, else
    :class:`~searchr1.core.scripted.ScriptedTeacher`."""
    asset = assets.get(asset_name(spec)) if is_builtin(spec) else None
    own = asset.ceiling(config, tokenizer, protocol) if asset and asset.ceiling else None
    return own if own is not None else ScriptedTeacher(tokenizer, protocol, questions)


async def cold_start(
    env: Environment,
    job: Job,
    trainer: Trainer,
    assets: Mapping[str, Asset],
    cs: ColdStartSettings,
    loss_fn: LossFn,
) -> ColdStartResult:
    """Run the cold start on ``trainer`` with ``loss_fn``, in train's event loop: ``env`` with
    the teacher (``assets``' ceiling agent, else the scripted one) as its sampler."""
    log, cfg, protocol = get_logger(), env.config, env.protocol
    spec = cs.data or cfg.data.train
    field = "train.cold_start.data" if cs.data else "data.train"
    questions = list(load_questions(spec, cfg.assets, field_name=field).questions)
    stream = QuestionStream(questions, cfg.run.seed + 1)
    teacher = teacher_for(cfg, env.sampler.tokenizer, protocol, spec, questions, assets)
    teach = dataclasses.replace(env, sampler=teacher)
    sampling = dataclasses.replace(sampling_params(cfg, protocol, greedy=True), seed=cfg.run.seed)
    adam = dataclasses.replace(adam_params(cfg), learning_rate=cs.lr)
    t0 = time.perf_counter()
    total = kept_total = 0
    tokens_total = 0.0
    losses: list[float] = []
    for step in range(1, cs.steps + 1):
        batch = draw_fitting(teach, job, stream, cs.questions_per_step, field)
        mine = job.world.shard(batch)  # torchrun: each rank its share (searchr1.core.distributed)
        teaching = rollout_and_score(
            teach, mine, group_size=1, sampling=sampling, id_prefix=f"cs{step}/"
        )
        groups = await job.phase(f"the cold start (step {step} of {cs.steps})", teaching)
        assert groups is not None  # every rank has rollouts (a stop raises)
        env.search.metrics(reset=True)  # the teacher's searches are not an RL step's
        trajectories = [g.trajectories[0] for g in groups]
        scored = [g.rewards[0] for g in groups]
        datums: list[Datum] = [
            trajectory_to_datum(trajectory, 1.0, cfg.train.max_datum_tokens)
            for trajectory, result in zip(trajectories, scored, strict=True)
            if result.reward > 0
        ]
        own_tokens = sum(sum(1 for a in d.advantages if a) for d in datums)
        counts = job.world.gather((len(datums), own_tokens))  # [(kept, tokens)] per rank
        kept, tokens = sum(c[0] for c in counts), sum(c[1] for c in counts)
        total += len(batch)
        kept_total += kept
        if not kept:
            log.warning(
                "cold_start.nothing_kept",
                step=step,
                reason="no scripted trajectory of this step found its answer (the reward "
                "scored every one <= 0); check that [search] returns the answers of "
                f"{spec!r}",
            )
            continue
        learned = await learn(
            trainer,
            job,
            datums,
            loss_fn,
            limits=batch_limits(cfg),
            loss_scale=1.0 / tokens,
            adam=adam,
        )
        # Mean over the trained tokens: nll_sum is the default loss's; another loss's own value.
        metrics = learned.train_metrics
        loss = metrics["nll_sum"] / tokens if "nll_sum" in metrics else learned.loss
        losses.append(loss)
        tokens_total += tokens
        log.info(
            "cold_start.step",
            step=step,
            steps=cs.steps,
            loss=round(loss, 4),
            kept=kept,
            trajectories=len(batch),
            tokens=tokens,
            seconds=round(time.perf_counter() - t0, 1),
        )
        log.info("progress", task="cold start", done=step, total=cs.steps)
    result = ColdStartResult(
        steps=cs.steps,
        trajectories=total,
        kept=kept_total,
        tokens=tokens_total,
        loss_first=losses[0] if losses else float("nan"),
        loss_last=losses[-1] if losses else float("nan"),
        seconds=time.perf_counter() - t0,
    )
    log.info("cold_start_done", **dataclasses.asdict(result), peak_rss_gb=peak_rss_gb())
    return result
