"""The same kind of plugin written against :mod:`searchr1.sdk`: a reward term, ``short_answer``
(-0.1 for an answer over 40 characters, else 0). Loading it warns nothing."""

from __future__ import annotations

from searchr1.sdk import Register, RewardFactory, RewardResult, Trajectory, hookimpl


def short_answer(trajectory: Trajectory, golden_answers) -> RewardResult:
    long = len(trajectory.final_answer or "") > 40
    return RewardResult(reward=-0.1 if long else 0.0, components={"long": float(long)})


@hookimpl
def register_rewards(register: Register[RewardFactory]) -> None:
    register("short_answer", lambda config: short_answer)
