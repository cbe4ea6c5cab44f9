"""The run's reward: the reward ``[reward] name`` chooses plus every shaping term ``[reward]
terms`` lists, each a registered reward (``docs/plugins.md``, ## register_rewards;
``docs/rewards.md``).

The total is the weighted sum of their rewards, each weighted by ``[reward] weights`` (1.0
when not named there). The chosen reward's components are kept as they are; each term adds its
own (unweighted) reward as component ``<term>`` and its components as ``<term>/<component>``,
so the step's ``metrics`` event shows ``reward/<term>`` next to ``reward/format`` and
``reward/correct``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from searchr1.core.config_schema import Config
from searchr1.core.errors import RemoteError
from searchr1.core.metric_schema import merge
from searchr1.core.plugins import Registry
from searchr1.core.types import Question, RewardFn, RewardResult, Trajectory

Item = tuple[Trajectory, Sequence[str]]


async def score_all(reward: RewardFn, items: Sequence[Item]) -> list[RewardResult]:
    """The reward of each ``(trajectory, golden answers)``, in order: by the reward's
    ``score_many`` when it has one, else one call each."""
    many = getattr(reward, "score_many", None)
    if many is not None:
        return list(await many(items))
    return [reward(t, g) for t, g in items]


def reward_metrics(reward: RewardFn, reset: bool = False) -> dict[str, float]:
    """The reward's ``metrics(reset)``, or {} when it reports none."""
    metrics = getattr(reward, "metrics", None)
    return {k: float(v) for k, v in metrics(reset).items()} if callable(metrics) else {}


def reward_problem(reward: RewardFn) -> str | None:
    """The reward's ``problem()``, or None."""
    problem = getattr(reward, "problem", None)
    return problem() if callable(problem) else None


def decided_failure(part: object) -> RemoteError | None:
    """``part``'s ``decided_failure()`` (a reward's or a search provider's), or None."""
    decided = getattr(part, "decided_failure", None)
    return decided() if callable(decided) else None


async def check_reward(reward: RewardFn, question: Question) -> None:
    """The reward's ``check(question)``, when it has one (a remote reward's first contact)."""
    check = getattr(reward, "check", None)
    if check is not None:
        await check(question)


async def close_reward(reward: RewardFn) -> None:
    """The reward's ``aclose()``, when it has one."""
    close = getattr(reward, "aclose", None)
    if close is not None:
        await close()


@dataclass(frozen=True)
class ComposedReward:
    """``base`` plus each named term, weighted and summed (see the module docstring)."""

    base: RewardFn
    terms: tuple[tuple[str, RewardFn], ...]
    #: weight of the base (``[reward] weights`` under ``[reward] name``) and of each term
    base_weight: float = 1.0
    weights: Mapping[str, float] = field(default_factory=dict)

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        base = self.base(trajectory, golden_answers)
        parts = [term(trajectory, golden_answers) for _, term in self.terms]
        return self._combine(base, parts)

    async def score_many(self, items: Sequence[Item]) -> list[RewardResult]:
        bases = await score_all(self.base, items)
        columns = [await score_all(term, items) for _, term in self.terms]
        return [
            self._combine(base, [column[i] for column in columns]) for i, base in enumerate(bases)
        ]

    def _combine(self, base: RewardResult, parts: Sequence[RewardResult]) -> RewardResult:
        total, components = self.base_weight * float(base.reward), dict(base.components)
        for (name, _), part in zip(self.terms, parts, strict=True):
            total += self.weights.get(name, 1.0) * float(part.reward)
            components[name] = float(part.reward)
            components.update({f"{name}/{k}": v for k, v in part.components.items()})
        return RewardResult(total, components)

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Every part's numbers, merged by their declared rule (two judges' spend adds up)."""
        parts = [reward_metrics(r, reset) for r in (self.base, *(t for _, t in self.terms))]
        return merge([m for m in parts if m])

    def problem(self) -> str | None:
        problems = (reward_problem(r) for r in (self.base, *(t for _, t in self.terms)))
        return next((p for p in problems if p), None)

    def decided_failure(self) -> RemoteError | None:
        failures = (decided_failure(r) for r in (self.base, *(t for _, t in self.terms)))
        return next((f for f in failures if f is not None), None)

    async def check(self, question: Question) -> None:
        for reward in (self.base, *(term for _, term in self.terms)):
            await check_reward(reward, question)

    async def aclose(self) -> None:
        for reward in (self.base, *(term for _, term in self.terms)):
            await close_reward(reward)


def create_reward(config: Config, registry: Registry) -> RewardFn:
    """The reward ``[reward] name`` registers, composed with ``[reward] terms`` when any (or
    when ``[reward] weights`` scales the reward itself)."""
    r = config.reward
    base = registry.create("reward", r.name, config)
    weights = dict(r.weights)
    if not r.terms and weights.get(r.name, 1.0) == 1.0:
        return base
    terms = tuple((name, registry.create("reward", name, config)) for name in r.terms)
    return ComposedReward(base, terms, weights.get(r.name, 1.0), weights)
