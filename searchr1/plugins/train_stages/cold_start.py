"""The ``cold_start`` train stage: supervised fine-tuning of the LoRA on scripted search
trajectories, before RL, on fresh runs with ``[train.cold_start] steps > 0``.

An instruct model asked to use a search tool usually never does, so every RL group is
degenerate and GRPO gets no signal. The stage runs::

    teacher    = the data asset's ceiling agent (Asset.ceiling), else ScriptedTeacher
    for step in 1..steps:
        trajectories = rollout(teacher, questions_per_step fresh questions, group_size 1)
                       through the run's search provider, protocol, chat template and limits
        kept         = those the reward scores above 0
        datums       = trajectory_to_datum(t, advantage 1): the RL masks
        forward_backward(micro-batch, loss_fn, 1 / trained tokens); optim_step

The loss (default ``cross_entropy``, ``-sum_t A_t lp_t``) is a registered loss run by the
model's trainer, so any training provider works. Then the held-out eval ``"cold_start"``; the
core writes checkpoint 0, so ``--resume`` never repeats the stage. The settings were once a
top-level ``[cold_start]`` table, which is still read."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from searchr1.core.assets import asset_name, is_builtin
from searchr1.core.batching import BatchLimits, pack_micro_batches
from searchr1.core.config_schema import Config, setting
from searchr1.core.config_validate import plugin_settings
from searchr1.core.datums import trajectory_to_datum
from searchr1.core.evaluation import heldout_eval, heldout_questions
from searchr1.core.logs import get_logger
from searchr1.core.step import adam_params
from searchr1.core.step_metrics import merge_train_metrics, peak_rss_gb
from searchr1.core.types import Asset, Datum, LossFn, Question, Sampler, StageRun


@dataclasses.dataclass(frozen=True)
class ColdStartSettings:
    """``[train.cold_start]``."""

    steps: int = setting(0, min=0, help="supervised steps before RL; 0 = off")
    questions_per_step: int = setting(16, min=1)
    lr: float = setting(1e-4, gt=0.0)
    loss_fn: str = setting(
        "cross_entropy", names="loss_fn", help="a registered loss; -sum(A * logprob) by default"
    )
    data: str = setting("", help="QA file the teacher plays; empty = data.train")


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


class ColdStart:
    """The stage; settings are read when created (before the model loads)."""

    def __init__(self, config: Config):
        self.cs = plugin_settings(config, "train", "cold_start", ColdStartSettings)
        self.spec = self.cs.data or config.data.train
        self.field = "train.cold_start.data" if self.cs.data else "data.train"
        self.heldout = heldout_questions(config) if self.cs.steps else []
        self.loss: LossFn | None = None

    def check(self, run: StageRun) -> None:
        """The loss must be registered and trainable by the run's trainer (before any
        rollout, so a bad name never costs an eval)."""
        if not self.cs.steps:
            return
        from searchr1.core.trainer_checks import check_loss

        self.loss = run.registry.create("loss_fn", self.cs.loss_fn, run.config)
        check_loss(
            run.trainer.capabilities,
            self.loss,
            field="train.cold_start.loss_fn",
            provider=run.config.model.provider,
        )

    def before_steps(self, run: StageRun) -> bool:
        if not self.cs.steps:
            return False
        if self.loss is None:
            self.check(run)
        run_cold_start(run, self.cs, self.spec, self.field, self.loss)  # type: ignore[arg-type]
        if self.heldout:
            heldout_eval(run, self.heldout, "cold_start")
        return True

    def after_steps(self, run: StageRun, step: int) -> None:
        """Nothing after RL."""


def teacher_for(
    config: Config,
    tokenizer: Any,
    protocol: Any,
    spec: str,
    questions: list[Question],
    assets: Mapping[str, Asset],
) -> Sampler:
    """The ``Asset.ceiling`` agent of ``spec``'s ``builtin:`` asset for this protocol, else
    :class:`~searchr1.plugins.train_stages.scripted_teacher.ScriptedTeacher`."""
    from searchr1.plugins.train_stages.scripted_teacher import ScriptedTeacher

    asset = assets.get(asset_name(spec)) if is_builtin(spec) else None
    own = asset.ceiling(config, tokenizer, protocol) if asset and asset.ceiling else None
    return own if own is not None else ScriptedTeacher(tokenizer, protocol, questions)


def run_cold_start(
    run: StageRun, cs: ColdStartSettings, spec: str, field: str, loss_fn: LossFn
) -> ColdStartResult:
    """Run the stage on the run's trainer with ``loss_fn``, inside train's event loop."""
    from searchr1.core.data import load_questions
    from searchr1.core.question_stream import QuestionStream
    from searchr1.core.rollout import rollout_questions, sampling_params

    log, cfg, protocol = get_logger(), run.config, run.protocol
    questions = list(load_questions(spec, field_name=field).questions)
    stream = QuestionStream(questions, cfg.run.seed + 1)
    teacher = teacher_for(
        cfg, run.sampler.tokenizer, protocol, spec, questions, run.registry.assets
    )
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
        groups = run.run(
            rollout_questions(
                teacher,
                run.search,
                protocol,
                batch,
                cfg,
                group_size=1,
                sampling=sampling,
                id_prefix=f"cs{step}/",
            )
        )
        run.search.metrics(reset=True)  # the teacher's searches are not an RL step's
        datums: list[Datum] = []
        for question, (trajectory,) in zip(batch, groups, strict=True):
            if run.reward(trajectory, question.golden_answers).reward > 0:
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
            run.trainer.forward_backward(mb, loss_fn, loss_scale=1.0 / tokens)
            for mb in pack_micro_batches(datums, limits)
        ]
        run.trainer.optim_step(dataclasses.replace(adam_params(cfg), learning_rate=cs.lr))
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
    log.info("cold_start_done", **dataclasses.asdict(result), peak_rss_gb=peak_rss_gb())
    return result
