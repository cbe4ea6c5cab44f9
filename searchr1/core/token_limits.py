"""Token limits, named: did a token setting cut a turn or a trajectory, and can one well-formed
turn fit at all? ``[model] max_new_tokens`` cuts a turn, ``[rollout] max_trajectory_tokens`` the
whole trajectory. A cut turn reads as an invalid action and a cut trajectory as ``token_limit``:
both look like a model that cannot follow the protocol while the cause is a config number.
:func:`limit_hits` counts such cuts after the fact (smoke's verdict, run notices);
:func:`turn_fit_warnings` predicts them before a run (``searchr1 config check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from searchr1.core.types import Question, Trajectory

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

#: a sampled turn that stopped on the token cap (providers report "stop" or "length")
LENGTH = "length"


@dataclass(frozen=True)
class LimitHits:
    """What the token limits cut in a set of trajectories (see :func:`limit_hits`)."""

    turns: int
    #: turns that stopped at ``max_new_tokens`` without a complete action
    turns_cut: int
    trajectories: int
    #: trajectories that ran out of ``max_trajectory_tokens``
    trajectories_cut: int
    max_new_tokens: int
    max_trajectory_tokens: int

    def sentences(self) -> list[str]:
        """One sentence per limit that cut something, with the counts and the setting."""
        out = []
        if self.turns_cut:
            out.append(
                f"{self.turns_cut} of {self.turns} turns ended at model.max_new_tokens = "
                f"{self.max_new_tokens} before the protocol's closing tag (stop reason "
                f"'length'): the action was cut off and read as invalid; raise "
                f"model.max_new_tokens"
            )
        if self.trajectories_cut:
            out.append(
                f"{self.trajectories_cut} of {self.trajectories} trajectories ran out of "
                f"rollout.max_trajectory_tokens = {self.max_trajectory_tokens} (prompt, turns "
                f"and observations): raise it (and train.max_datum_tokens with it) or lower "
                f"rollout.max_observation_tokens"
            )
        return out


def limit_hits(
    trajectories: Sequence[Trajectory], *, max_new_tokens: int, max_trajectory_tokens: int
) -> LimitHits:
    """Count the cuts. A turn without an action that stopped on length after
    ``max_new_tokens`` tokens is cut by that; one that stopped on length earlier hit the
    trajectory budget (the rollout caps a turn at the tokens left), so its trajectory counts
    as cut by ``max_trajectory_tokens``, as does every ``token_limit`` trajectory."""
    turns = turns_cut = cut = 0
    for traj in trajectories:
        budget = traj.end_reason == "token_limit"
        for turn in traj.turns:
            turns += 1
            if turn.stop_reason != LENGTH or turn.action in ("search", "answer"):
                continue
            if len(turn.sampled_tokens) >= max_new_tokens:
                turns_cut += 1
            else:
                budget = True
        cut += budget
    return LimitHits(
        turns=turns,
        turns_cut=turns_cut,
        trajectories=len(trajectories),
        trajectories_cut=cut,
        max_new_tokens=max_new_tokens,
        max_trajectory_tokens=max_trajectory_tokens,
    )


def turn_fit_warnings(config: Config, protocol: Any, question: Question) -> list[str]:
    """Warnings when the first prompt plus one well-formed search turn (the question as
    query) exceeds ``rollout.max_trajectory_tokens``, or that turn alone exceeds
    ``model.max_new_tokens``; ``protocol`` is built on the run's tokenizer."""
    prompt = len(protocol.initial_prompt_tokens(question))
    turn = len(protocol.assistant_turn_tokens(query=question.question))
    answer = len(protocol.assistant_turn_tokens(answer=question.golden_answers[0]))
    cfg_new, cfg_traj = config.model.max_new_tokens, config.rollout.max_trajectory_tokens
    shown = f"{protocol.name} protocol, question {question.question!r}"
    out = []
    if prompt + turn > cfg_traj:
        out.append(
            f"rollout.max_trajectory_tokens = {cfg_traj} cannot hold the first prompt "
            f"({prompt} tokens) plus one well-formed search turn ({turn} tokens) = "
            f"{prompt + turn} ({shown}): every trajectory would end at the token limit; raise "
            f"it to at least {prompt + turn + answer} (and train.max_datum_tokens with it)"
        )
    if turn > cfg_new:
        out.append(
            f"model.max_new_tokens = {cfg_new} is shorter than one well-formed search turn "
            f"({turn} tokens, {shown}): such a turn is cut before its closing tag and read as "
            f"an invalid action; raise model.max_new_tokens to at least {turn} (more if the "
            f"model reasons before it calls)"
        )
    return out
