"""The verdict of ``searchr1 smoke``: the reference setup's smoke criteria
(``docs/reference-setup.md`` §2), one line each.

:func:`reference_criteria` makes them four named checks over one group: search success is a
channel (exit 1), the other three describe the model's behaviour (exit 3). :func:`key_warnings`
applies the troubleshooting rule for keys (§3): some out of quota is a warning naming their
indexes (rotate), every key limited a failure (stop and wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.types import RewardResult, Trajectory


@dataclass(frozen=True)
class Criterion:
    name: str
    ok: bool
    detail: str
    #: failing it means a broken channel (exit 1), not the model's behaviour (exit 3)
    channel: bool = False
    #: the id ``[smoke] report_only`` names (``both_signs``, ``searches_in_range``,
    #: ``answer_format``); empty for the channel criterion, which is always required
    key: str = ""
    #: False when ``[smoke] report_only`` lists ``key``: printed, never a failure
    required: bool = True

    @property
    def passed(self) -> bool:
        """What the exit code reads: met, or not required."""
        return self.ok or not self.required

    def line(self) -> str:
        state = "ok" if self.ok else "FAILED" if self.required else "not met, reported only"
        return f"verdict: {self.name}: {state} ({self.detail})"


def report_only(criteria: Sequence[Criterion], keys: Sequence[str]) -> list[Criterion]:
    """``criteria`` with those ``[smoke] report_only`` names marked not required."""
    return [replace(c, required=False) if c.key in keys else c for c in criteria]


def reference_criteria(
    trajectories: Sequence[Trajectory],
    results: Sequence[RewardResult],
    *,
    protocol: AgentProtocol | type[AgentProtocol],
    max_search_calls: int,
    search_success: float,
    min_success_rate: float,
) -> list[Criterion]:
    """The four criteria over one group (an empty group fails the first three), judged by
    what the trajectories did: their searches, and the format verdict the rollout recorded
    by ``protocol``'s rule (``Trajectory.format_ok``; ``protocol`` names the format in the
    line), whatever the search provider's metrics or the reward's components say.
    ``search_success``: over the searches judged (the trajectories' and smoke's probe, so
    never none)."""
    return [
        _both_signs([r.reward for r in results]),
        _searches_in_range(trajectories, max_search_calls),
        _answer_format(trajectories, protocol),
        Criterion(
            f"search success >= {min_success_rate:.0%}",
            search_success >= min_success_rate,
            channel=True,
            detail=f"{search_success:.2%}"
            + (
                ""
                if search_success >= min_success_rate
                else "; check key quota (429), [search] timeout_seconds and api_base"
            ),
        ),
    ]


def _both_signs(rewards: Sequence[float]) -> Criterion:
    pos, neg = sum(r > 0 for r in rewards), sum(r < 0 for r in rewards)
    detail = f"{pos} positive, {neg} negative of {len(rewards)}"
    if not pos:
        detail += "; no trajectory answered correctly"
    if rewards and not neg:
        detail += "; every trajectory wrote the answer format, so no -0.1 shows the penalty works"
    return Criterion("rewards of both signs", pos > 0 and neg > 0, detail, key="both_signs")


def _searches_in_range(trajectories: Sequence[Trajectory], max_search_calls: int) -> Criterion:
    outside = [i for i, t in enumerate(trajectories) if not 1 <= t.search_calls <= max_search_calls]
    if not trajectories:
        detail = "no trajectories"
    elif outside:
        calls = ", ".join(f"{i} ({trajectories[i].search_calls})" for i in outside)
        detail = f"trajectories {calls} searched outside the range"
    else:
        detail = "every trajectory"
    return Criterion(
        f"searches within 1..{max_search_calls}",
        bool(trajectories) and not outside,
        detail,
        key="searches_in_range",
    )


def _answer_format(
    trajectories: Sequence[Trajectory], protocol: AgentProtocol | type[AgentProtocol]
) -> Criterion:
    formatted = sum(t.format_ok for t in trajectories)
    ends = sorted({t.end_reason for t in trajectories})
    return Criterion(
        f"answers in the {protocol.name} format ({protocol.answer_format})",
        formatted > 0,
        f"{formatted} of {len(trajectories)} answered in the format"
        + ("" if formatted else f"; the model never wrote it (end reasons: {', '.join(ends)})"),
        key="answer_format",
    )


def key_warnings(search: Any) -> tuple[list[str], list[str]]:
    """``(warnings, problems)`` about the search keys of ``search`` (a provider with a
    ``keys`` :class:`~searchr1.kit.search.keys.KeyPool`; others have none)."""
    pool = getattr(search, "keys", None)
    reasons: dict[int, str] = dict(getattr(pool, "bench_reasons", {}) or {})
    if pool is None or not reasons or getattr(pool, "anonymous", False):
        return [], []
    total, left = len(pool), pool.available_count()
    listed = ", ".join(f"key {i} ({why})" for i, why in sorted(reasons.items()))
    if left == 0:
        return [], [
            f"every search key is limited or rejected ({listed}): stop and wait for the quota to "
            f"reset or add keys to [search] api_keys; training now would learn from search failures"
        ]
    return [
        f"{len(reasons)} of {total} search keys benched ({listed}); the other {left} served the "
        f"searches. Keys are counted from 0 in the order of [search] api_keys"
    ], []
