"""The run's reward: the reward ``[reward] name`` chooses plus every shaping term ``[reward]
terms`` lists, each a registered reward (``docs/plugins.md``, ## register_rewards).

The total is the sum of their rewards. The chosen reward's components are kept as they are;
each term adds its own reward as component ``<term>`` and its components as
``<term>/<component>``, so the step's ``metrics`` event shows ``reward/<term>`` next to
``reward/format`` and ``reward/correct``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from searchr1.core.config_schema import Config
from searchr1.core.plugins import Registry
from searchr1.core.types import RewardFn, RewardResult, Trajectory


@dataclass(frozen=True)
class ComposedReward:
    """``base`` plus each named term, summed (see the module docstring)."""

    base: RewardFn
    terms: tuple[tuple[str, RewardFn], ...]

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        result = self.base(trajectory, golden_answers)
        total, components = float(result.reward), dict(result.components)
        for name, term in self.terms:
            part = term(trajectory, golden_answers)
            total += float(part.reward)
            components[name] = float(part.reward)
            components.update({f"{name}/{k}": v for k, v in part.components.items()})
        return RewardResult(total, components)


def create_reward(config: Config, registry: Registry) -> RewardFn:
    """The reward ``[reward] name`` registers, composed with ``[reward] terms`` when any."""
    base = registry.create("reward", config.reward.name, config)
    if not config.reward.terms:
        return base
    terms = tuple((name, registry.create("reward", name, config)) for name in config.reward.terms)
    return ComposedReward(base, terms)
