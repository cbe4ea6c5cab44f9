"""The algorithm with no run around it: :func:`searchr1.rl.step.collect` and ``learn`` over an
:class:`~searchr1.rl.job.Environment` (a scripted policy, a search, the tags protocol, an
exact-match reward) and the scripted model's trainer, no run folder, events or registry.
Swapping the advantage estimator or the loss is an argument, read by nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from fakes import FakeSearch, ScriptedModel, tiny_tokenizer

from searchr1.core.config_schema import Config
from searchr1.core.question_stream import QuestionStream
from searchr1.core.types import AdamParams, Datum, LossInputs, Question, RewardResult, Trajectory
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.rl.batching import BatchLimits
from searchr1.rl.job import Environment, Job
from searchr1.rl.step import Batch, Learned, collect, learn

Q = Question(id="q1", question="Who wrote the old book?", golden_answers=("Alice",))
#: one group of two: the first answers right, the second wrong
SCRIPTS = [["<answer> Alice </answer>"], ["<answer> Bob </answer>"]]


def exact_match(trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
    return RewardResult(reward=float(trajectory.final_answer in golden_answers))


def loss(inputs: LossInputs) -> None:  # the scripted trainer records datums, never calls it
    raise AssertionError("not called")


def one_step(estimator: str) -> tuple[Batch, Learned, list[Datum]]:
    tok = tiny_tokenizer()
    model = ScriptedModel(tok, SCRIPTS)
    cfg = Config().replace(
        rollout={"questions_per_batch": 1, "group_size": 2, "max_trajectory_tokens": 512},
        model={"max_new_tokens": 64},
        train={"advantage_estimator": estimator},
    )
    env = Environment(model, FakeSearch(), TagsProtocol(tok), exact_match, cfg)
    job = Job()

    async def step() -> tuple[Batch, Learned]:
        batch = await collect(env, job, QuestionStream([Q], seed=0), step=1, policy_version=0)
        learned = await learn(
            model,
            job,
            batch.datums(512),
            loss,
            limits=BatchLimits(512, 8, 4096),
            loss_scale=0.5,
            adam=AdamParams(learning_rate=1e-3),
        )
        return batch, learned

    batch, learned = asyncio.run(step())
    return batch, learned, model.trained


@pytest.mark.parametrize(("estimator", "right"), [("grpo", 0.5), ("rloo", 1.0)])
def test_one_step_over_an_environment_and_a_trainer_needs_no_run(
    estimator: str, right: float
) -> None:
    batch, learned, trained = one_step(estimator)
    (group,) = batch.groups
    assert [r.reward for r in group.rewards] == [1.0, 0.0]
    # grpo: r - mean(group); rloo: r - mean(the others) = G / (G - 1) * (r - mean)
    assert group.advantages == (right, -right)
    assert len(trained) == 2  # both trajectories carry a non-zero advantage
    for datum, advantage in zip(trained, group.advantages, strict=True):
        assert {a for a, s in zip(datum.advantages, datum.sampled, strict=True) if s} == {advantage}
        assert not any(a for a, s in zip(datum.advantages, datum.sampled, strict=True) if not s)
    sampled = sum(sum(d.sampled) for d in trained)
    assert learned.train_metrics["tokens"] == sampled > 0
