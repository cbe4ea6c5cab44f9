"""The cold-start stage: supervised fine-tuning of the LoRA on scripted search trajectories.

An instruct model asked to use a search tool usually never does, so every RL group is
degenerate and GRPO gets no signal. With ``[cold_start] steps > 0`` (and not resuming),
``searchr1 train`` first runs::

    teacher    = the data asset's ceiling agent, else ScriptedTeacher
    for step in 1..steps:
        trajectories = rollout(teacher, questions_per_step fresh questions, group_size 1)
                       through the run's search provider, protocol, chat template and limits
        kept         = those the reward scores above 0
        datums       = trajectory_to_datum(t, advantage 1): the RL masks
        forward_backward(micro-batch, cold_start.loss_fn, 1 / trained tokens); optim_step

The loss (default ``-sum_t A_t lp_t``) is a registered loss run by the model's trainer, so
any training provider works. Then the held-out eval ``"cold_start"`` and checkpoint 0, so
``--resume`` never repeats the stage."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from searchr1.core.batching import BatchLimits, pack_micro_batches
from searchr1.core.builtins import ceiling_agent
from searchr1.core.config_schema import Config
from searchr1.core.datums import trajectory_to_datum
from searchr1.core.logs import get_logger
from searchr1.core.plugins import Registry
from searchr1.core.runs import Components
from searchr1.core.step import adam_params
from searchr1.core.step_metrics import merge_train_metrics
from searchr1.core.types import Datum, LossFn, Question, Sampler, Trainer


@dataclasses.dataclass(frozen=True)
class ColdStartResult:
    """What the stage did, for the ``cold_start_done`` event and the benchmark."""

    steps: int
    trajectories: int
    kept: int
    tokens: float
    loss_first: float
    loss_last: float
    seconds: float


def teacher_for(cfg: Config, tokenizer: Any, protocol: Any, questions: list[Question]) -> Sampler:
    """The data asset's ``Asset.ceiling`` agent for this protocol, else
    :class:`~searchr1.core.scripted_teacher.ScriptedTeacher`."""
    from searchr1.core.scripted_teacher import ScriptedTeacher

    own = ceiling_agent(cfg, tokenizer, protocol, spec=_data_spec(cfg))
    return own if own is not None else ScriptedTeacher(tokenizer, protocol, questions)


def run_cold_start(
    runner: asyncio.Runner, c: Components, protocol: Any, cfg: Config, loss_fn: LossFn
) -> ColdStartResult:
    """Run ``[cold_start]`` on the run's model with ``loss_fn`` (:func:`cold_start_loss`),
    inside train's event loop."""
    from searchr1.core.data import load_questions
    from searchr1.core.question_stream import QuestionStream
    from searchr1.core.rollout import rollout_questions, sampling_params

    log = get_logger()
    cs = cfg.cold_start
    spec = _data_spec(cfg)
    questions = list(load_questions(spec, field_name=_data_field(cfg)).questions)
    stream = QuestionStream(questions, cfg.run.seed + 1)
    trainer = c.trainer
    teacher = teacher_for(cfg, c.model.sampler.tokenizer, protocol, questions)
    limits = BatchLimits(
        cfg.train.max_datum_tokens,
        cfg.train.max_micro_batch_datums,
        cfg.train.max_micro_batch_tokens,
    )
    sampling = dataclasses.replace(sampling_params(cfg, protocol, greedy=True), seed=cfg.run.seed)
    t0 = time.perf_counter()
    total = kept_total = 0
    tokens_total = 0.0
    losses: list[float] = []
    for step in range(1, cs.steps + 1):
        batch = stream.next_batch(cs.questions_per_step)
        groups = runner.run(
            rollout_questions(
                teacher,
                c.search,
                protocol,
                batch,
                cfg,
                group_size=1,
                sampling=sampling,
                id_prefix=f"cs{step}/",
            )
        )
        c.search.metrics(reset=True)  # the teacher's searches are not an RL step's
        datums: list[Datum] = []
        for question, (trajectory,) in zip(batch, groups, strict=True):
            if c.reward(trajectory, question.golden_answers).reward > 0:
                datums.append(trajectory_to_datum(trajectory, 1.0, cfg.train.max_datum_tokens))
        total += len(batch)
        kept_total += len(datums)
        if not datums:
            log.warning(
                "cold_start.nothing_kept",
                step=step,
                reason="no scripted trajectory of this step found its answer (the reward "
                "scored every one <= 0); check that [search] returns the answers of "
                f"{spec!r}",
            )
            continue
        tokens = sum(sum(1 for a in d.advantages if a) for d in datums)
        results = [
            trainer.forward_backward(mb, loss_fn, loss_scale=1.0 / tokens)
            for mb in pack_micro_batches(datums, limits)
        ]
        trainer.optim_step(dataclasses.replace(adam_params(cfg), learning_rate=cs.lr))
        metrics = merge_train_metrics([r.metrics for r in results])
        # Mean over the trained tokens: nll_sum is the default loss's; another loss's own value.
        if "nll_sum" in metrics:
            loss = metrics["nll_sum"] / tokens
        else:
            loss = sum(r.loss for r in results)
        losses.append(loss)
        tokens_total += tokens
        log.info(
            "cold_start.step",
            step=step,
            steps=cs.steps,
            loss=round(loss, 4),
            kept=len(datums),
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
    log.info("cold_start_done", **dataclasses.asdict(result))
    return result


def _data_spec(cfg: Config) -> str:
    return cfg.cold_start.data or cfg.data.train


def _data_field(cfg: Config) -> str:
    return "cold_start.data" if cfg.cold_start.data else "data.train"


def cold_start_loss(cfg: Config, registry: Registry, trainer: Trainer | None = None) -> LossFn:
    """The ``[cold_start] loss_fn`` plugin (its name is checked with the config's other plugin
    names); a loss the ``trainer`` cannot train is a ConfigError naming that setting."""
    from searchr1.core.trainer_checks import check_loss

    name = cfg.cold_start.loss_fn
    loss: LossFn = registry.create("loss_fn", name, cfg)
    if trainer is not None:
        check_loss(
            trainer.capabilities, loss, field="cold_start.loss_fn", provider=cfg.model.provider
        )
    return loss
