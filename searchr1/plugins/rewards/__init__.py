"""Built-in rewards, chosen by ``[reward] name`` (or listed in ``[reward] terms``) and called
once per finished trajectory (``docs/rewards.md``). Every built-in reports the same
components, so dashboards do not depend on the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from searchr1.kit.judge import Judge, JudgeItem, JudgeSettings, settings_problems
from searchr1.plugins.rewards.search_terms import (
    AnswerLengthPenalty,
    AnswerLengthSettings,
    RetrievalCredit,
    RetrievalCreditSettings,
    SearchCost,
    SearchCostSettings,
)
from searchr1.sdk import (
    Question,
    Register,
    RewardFactory,
    RewardFn,
    RewardResult,
    Trajectory,
    exact_match,
    f1_score,
    hookimpl,
    plugin_settings,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config, RemoteError


@dataclass(frozen=True)
class RewardSettings:
    #: the reward of a trajectory without exactly one answer in the format
    format_penalty: float = -0.1
    #: the reward of an exact-match answer
    correct_reward: float = 1.0


def components(trajectory: Trajectory, golden_answers: Sequence[str]) -> dict[str, float]:
    """``format``, ``correct`` and ``f1`` of one trajectory (see the module docstring): the
    format verdict and the final answer as the rollout recorded them."""
    return {
        "format": float(trajectory.format_ok),
        "correct": float(exact_match(trajectory.final_answer, golden_answers)),
        "f1": f1_score(trajectory.final_answer, golden_answers),
    }


@dataclass(frozen=True)
class FormatAnswerReward:
    """``format_penalty`` unless the answer format is right, then ``correct_reward`` times
    the ``score`` component (``correct``: exact match, 1.0 / 0.0; ``f1``: token F1)."""

    settings: RewardSettings
    use_format: bool = True
    use_answer: bool = True
    score: str = "correct"

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        parts = components(trajectory, golden_answers)
        reward = 0.0
        if self.use_format and not parts["format"]:
            reward = self.settings.format_penalty
        elif self.use_answer:
            reward = self.settings.correct_reward * parts[self.score]
        return RewardResult(reward=reward, components=parts)


@dataclass(frozen=True)
class JudgeRewardSettings(JudgeSettings):
    """``[reward.judge]``: the judge's settings and the format rule's."""

    #: the reward of a trajectory without exactly one answer in the format
    format_penalty: float = -0.1
    #: the reward of an answer the judge calls right (a score scales it)
    correct_reward: float = 1.0


class JudgeReward:
    """``format_penalty`` unless the answer format is right, then ``correct_reward`` times the
    judge's score; a trajectory the judge gave no verdict for is scored by ``fallback``
    (``em``: exact match, ``f1``, ``zero``) and counted in ``reward/judge_fallbacks``.

    The judge is asynchronous: :meth:`score_many` judges a whole batch at once, in the
    command's event loop (what the train loop, the cold start and eval await, through
    :func:`searchr1.core.rewards.score_all`); calling the reward synchronously raises
    TypeError."""

    def __init__(self, settings: JudgeRewardSettings):
        self.settings = settings
        self.judge = Judge(settings)
        self._fallbacks = 0

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        # A sync call would need a loop of its own, and the judge's pool belongs to the
        # command's loop.
        raise TypeError(
            "the judge reward is asynchronous: await its score_many([(trajectory, "
            "golden_answers)]) (or searchr1.core.rewards.score_all) in the command's event "
            "loop instead of calling it"
        )

    async def score_many(
        self, items: Sequence[tuple[Trajectory, Sequence[str]]]
    ) -> list[RewardResult]:
        s = self.settings
        parts = [components(t, g) for t, g in items]
        # only answers in the format are judged: the others get the penalty whatever they say
        asked = [i for i, (t, _) in enumerate(items) if parts[i]["format"] and t.final_answer]
        verdicts = await self.judge.judge_many(
            [
                JudgeItem(items[i][0].question, items[i][0].final_answer or "", tuple(items[i][1]))
                for i in asked
            ]
        )
        scores = dict(zip(asked, verdicts, strict=True))
        out = []
        for i, part in enumerate(parts):
            verdict = scores.get(i)
            score = 0.0
            if verdict is not None and verdict.score is not None:
                score = verdict.score
                part["judge_vs_em"] = float((score >= 0.5) == bool(part["correct"]))
            elif verdict is not None:
                self._fallbacks += 1
                score = {"em": part["correct"], "f1": part["f1"], "zero": 0.0}[s.fallback]
            part["judge"] = score
            reward = s.format_penalty if not part["format"] else s.correct_reward * score
            out.append(RewardResult(reward=reward, components=part))
        return out

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """The judge's spend (:meth:`Judge.metrics`) and ``reward/judge_fallbacks``: the
        trajectories of the step scored by the fallback."""
        out = {**self.judge.metrics(reset), "reward/judge_fallbacks": float(self._fallbacks)}
        if reset:
            self._fallbacks = 0
        return out

    def problem(self) -> str | None:
        return self.judge.problem()

    def decided_failure(self) -> RemoteError | None:
        return self.judge.decided_failure()

    async def check(self, question: Question) -> None:
        """One judge call on ``question`` with its first golden answer as the prediction
        (:meth:`Judge.check`: past the caches; raises the failure's RemoteError)."""
        golden = tuple(question.golden_answers)
        await self.judge.check(JudgeItem(question.question, golden[0] if golden else "", golden))

    async def aclose(self) -> None:
        await self.judge.aclose()


def _factory(
    name: str, use_format: bool, use_answer: bool, score: str = "correct"
) -> Callable[[Config], FormatAnswerReward]:
    def create(config: Config) -> FormatAnswerReward:
        return FormatAnswerReward(
            plugin_settings(config, "reward", name, RewardSettings),
            use_format,
            use_answer,
            score=score,
        )

    return create


def _judge(config: Config) -> JudgeReward:
    settings = plugin_settings(config, "reward", "judge", JudgeRewardSettings, settings_problems)
    return JudgeReward(settings)


@hookimpl
def register_rewards(register: Register[RewardFactory]) -> None:
    register("format_answer", _factory("format_answer", True, True), settings=RewardSettings)
    register("format", _factory("format", True, False), settings=RewardSettings)
    register("answer", _factory("answer", False, True), settings=RewardSettings)
    register("f1", _factory("f1", True, True, "f1"), settings=RewardSettings)
    register(
        "judge",
        _judge,
        settings=JudgeRewardSettings,
        secret_variables={"api_key": "TAOTOKEN_API_KEY"},
    )
    for name, reward, table in (
        ("retrieval_credit", RetrievalCredit, RetrievalCreditSettings),
        ("search_cost", SearchCost, SearchCostSettings),
        ("answer_length_penalty", AnswerLengthPenalty, AnswerLengthSettings),
    ):
        register(name, _term(name, reward, table), settings=table)


def _term(name: str, reward: Callable[[Any], RewardFn], table: type) -> RewardFactory:
    """The factory of a search-behaviour term: its ``[reward.<name>]`` settings, checked."""

    def create(config: Config) -> RewardFn:
        return reward(plugin_settings(config, "reward", name, table))

    return create
