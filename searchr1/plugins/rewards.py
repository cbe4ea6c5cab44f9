"""Built-in rewards: ``format``, ``answer`` and their combination ``format_answer`` (the
default, the reference setup's reward table), chosen by ``[reward] name`` and called once
per finished trajectory. Every built-in reports the same components, so dashboards do not
depend on the choice:

* ``format``: 1.0 when the trajectory answered and its generated text holds exactly one
  non-empty final answer (one ``<answer>`` element under the ``tags`` protocol, one
  ``Answer:`` line outside ``<think>`` blocks under ``tool_calls``), else 0.0;
* ``correct``: 1.0 when the protocol's final answer exactly matches a golden answer after
  normalisation (:func:`searchr1.core.answers.normalize_answer`), else 0.0;
* ``f1``: the best token F1 against the golden answers (a metric, never part of a reward).

Rewards (``docs/protocols.md`` §4): ``format_answer`` = ``format_penalty`` (-0.1) when the
format is wrong, else 1.0 / 0.0 by exact match; ``format`` = 0.0 or ``format_penalty``;
``answer`` = 1.0 / 0.0 by exact match alone. Optional settings: ``[reward.<name>]
format_penalty = -0.1``, ``correct_reward = 1.0``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from searchr1.core.answers import exact_match, f1_score
from searchr1.core.config_validate import plugin_settings
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import Registry, load_registry
from searchr1.core.protocols import protocol_class
from searchr1.core.types import RewardResult, Trajectory

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config


@dataclass(frozen=True)
class RewardSettings:
    #: the reward of a trajectory without exactly one answer in the format
    format_penalty: float = -0.1
    #: the reward of an exact-match answer
    correct_reward: float = 1.0


def components(
    trajectory: Trajectory, golden_answers: Sequence[str], registry: Registry
) -> dict[str, float]:
    """``format``, ``correct`` and ``f1`` of one trajectory (see the module docstring); its
    answers are read by the protocol ``registry`` registers under its ``protocol`` name."""
    protocol = trajectory.protocol or "tags"  # a hand-built trajectory names none
    format_ok = protocol_class(protocol, registry).answered_in_format(trajectory)
    return {
        "format": float(format_ok),
        "correct": float(exact_match(trajectory.final_answer, golden_answers)),
        "f1": f1_score(trajectory.final_answer, golden_answers),
    }


@dataclass(frozen=True)
class FormatAnswerReward:
    """``format_penalty`` unless the answer format is right, then exact match (1.0 / 0.0)."""

    settings: RewardSettings
    use_format: bool = True
    use_answer: bool = True
    #: the installed plugins, whose protocols read a trajectory's answers
    registry: Registry = field(default_factory=load_registry, repr=False)

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        parts = components(trajectory, golden_answers, self.registry)
        reward = 0.0
        if self.use_format and not parts["format"]:
            reward = self.settings.format_penalty
        elif self.use_answer and parts["correct"]:
            reward = self.settings.correct_reward
        return RewardResult(reward=reward, components=parts)


def _factory(
    name: str, use_format: bool, use_answer: bool
) -> Callable[[Config], FormatAnswerReward]:
    def create(config: Config) -> FormatAnswerReward:
        return FormatAnswerReward(
            plugin_settings(config, "reward", name, RewardSettings), use_format, use_answer
        )

    return create


@hookimpl
def register_rewards(
    register: Callable[[str, Callable[[Config], FormatAnswerReward]], None],
) -> None:
    register("format_answer", _factory("format_answer", True, True), settings=RewardSettings)
    register("format", _factory("format", True, False), settings=RewardSettings)
    register("answer", _factory("answer", False, True), settings=RewardSettings)
