"""Reward terms for search behaviour, composed with the run's reward by ``[reward] terms`` and
``[reward] weights`` (``docs/rewards.md``, "Search behaviour"); registered by
:mod:`searchr1.plugins.rewards`. Each reads the finished trajectory only:

* ``retrieval_credit``: ``credit`` when a passage the trajectory retrieved (an observation of
  a successful search) contains a golden answer, normalised as exact match is (process credit);
* ``search_cost``: ``-cost_per_search`` per search past ``free_searches`` (``only_when_correct``);
* ``answer_length_penalty``: ``-per_token`` per normalised answer token past the longest
  golden answer plus ``margin`` tokens, at most ``max_penalty`` (against F1 answer padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from searchr1.sdk import RewardResult, Trajectory, exact_match, normalize_answer


def contains_answer(text: str, golden_answers: Sequence[str]) -> bool:
    """A normalised golden answer occurs in the normalised ``text`` as whole words."""
    haystack = f" {normalize_answer(text)} "
    return any((gold := normalize_answer(g)) and f" {gold} " in haystack for g in golden_answers)


def retrieved_passages(trajectory: Trajectory) -> list[str]:
    """The observation of each search of ``trajectory`` that returned without an error."""
    return [
        t.observation_text
        for t in trajectory.turns
        if t.action == "search" and t.search_error is None and t.observation_text
    ]


@dataclass(frozen=True)
class RetrievalCreditSettings:
    """``[reward.retrieval_credit]``."""

    #: the reward of a trajectory whose searches retrieved a golden answer
    credit: float = field(default=0.1, metadata={"min": 0.0})


@dataclass(frozen=True)
class RetrievalCredit:
    """``credit`` x ``hit``; components ``hit`` (some retrieved passage holds a golden answer)
    and ``hit_rate`` (share of the trajectory's searches whose passages do; 0 without one)."""

    settings: RetrievalCreditSettings = RetrievalCreditSettings()

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        passages = retrieved_passages(trajectory)
        hits = [contains_answer(p, golden_answers) for p in passages]
        hit = float(any(hits))
        rate = sum(hits) / trajectory.search_calls if trajectory.search_calls else 0.0
        return RewardResult(self.settings.credit * hit, {"hit": hit, "hit_rate": rate})


@dataclass(frozen=True)
class SearchCostSettings:
    """``[reward.search_cost]``."""

    #: what each search call costs the reward (the term is minus the sum)
    cost_per_search: float = field(default=0.05, metadata={"min": 0.0})
    #: searches of a trajectory that cost nothing
    free_searches: int = field(default=0, metadata={"min": 0})
    #: charge only a trajectory whose answer is an exact match: a wrong answer is not made
    #: worse for one more search, so a group that has not found the answer yet is never
    #: pushed away from searching further (the price then ranks right answers by their
    #: searches only, as OTC-PO's correctness-gated tool reward does)
    only_when_correct: bool = False


@dataclass(frozen=True)
class SearchCost:
    """``-cost_per_search`` x (search calls - ``free_searches``, at least 0), or 0 with
    ``only_when_correct`` and an answer that is not an exact match; components ``searches``
    (calls, failed ones included: each was asked) and ``charged``."""

    settings: SearchCostSettings = SearchCostSettings()

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        s = self.settings
        charged = max(0, trajectory.search_calls - s.free_searches)
        if s.only_when_correct and not exact_match(trajectory.final_answer, golden_answers):
            charged = 0
        return RewardResult(
            -s.cost_per_search * charged,
            {"searches": float(trajectory.search_calls), "charged": float(charged)},
        )


@dataclass(frozen=True)
class AnswerLengthSettings:
    """``[reward.answer_length_penalty]``."""

    #: answer tokens past the longest golden answer's that cost nothing
    margin: int = field(default=3, metadata={"min": 0})
    #: what each answer token past the margin costs the reward
    per_token: float = field(default=0.05, metadata={"min": 0.0})
    #: the most the term takes away (0 = no bound)
    max_penalty: float = field(default=0.5, metadata={"min": 0.0})


@dataclass(frozen=True)
class AnswerLengthPenalty:
    """``-min(per_token x excess, max_penalty)`` with ``excess`` the normalised answer's
    tokens past the longest normalised golden answer's plus ``margin``; components
    ``answer_tokens`` and ``excess_tokens``. No answer: 0 (the format rule prices that)."""

    settings: AnswerLengthSettings = AnswerLengthSettings()

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult:
        s = self.settings
        tokens = len(normalize_answer(trajectory.final_answer or "").split())
        longest = max((len(normalize_answer(g).split()) for g in golden_answers), default=0)
        excess = max(0, tokens - longest - s.margin) if tokens else 0
        penalty = s.per_token * excess
        if s.max_penalty > 0:
            penalty = min(penalty, s.max_penalty)
        return RewardResult(
            -penalty, {"answer_tokens": float(tokens), "excess_tokens": float(excess)}
        )
