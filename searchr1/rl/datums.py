"""Trajectory -> Datum: the full multi-turn sequence, shifted by one. Position ``i`` predicts
``tokens[i + 1]``. Where the policy sampled ``tokens[i + 1]`` the datum carries its sampler
log-prob and the trajectory's advantage, and is ``sampled``; on prompt and observation positions
both are 0, so search results never enter the loss (``docs/protocols.md`` §5).
"""

from __future__ import annotations

from searchr1.core.errors import ConfigValueError
from searchr1.core.types import Datum, Trajectory


class DatumTooLongError(ConfigValueError):
    """A trajectory does not fit in ``train.max_datum_tokens`` (never silently truncated)."""


def trajectory_to_datum(trajectory: Trajectory, advantage: float, max_datum_tokens: int) -> Datum:
    tokens = trajectory.tokens
    n = len(tokens) - 1
    if n > max_datum_tokens:
        raise DatumTooLongError(
            f"trajectory {trajectory.trajectory_id} needs a datum of {n} tokens, more than "
            f"train.max_datum_tokens = {max_datum_tokens}; raise it, or lower "
            f"rollout.max_trajectory_tokens (the loss is never silently truncated)"
        )
    if n < 1:
        raise DatumTooLongError(f"trajectory {trajectory.trajectory_id} has fewer than 2 tokens")
    generated = trajectory.generated_mask[1:]
    return Datum(
        input_tokens=tuple(tokens[:-1]),
        target_tokens=tuple(tokens[1:]),
        sampler_logprobs=tuple(
            lp if g else 0.0 for lp, g in zip(trajectory.logprobs[1:], generated, strict=True)
        ),
        advantages=tuple(advantage if g else 0.0 for g in generated),
        trajectory_id=trajectory.trajectory_id,
        policy_version=trajectory.policy_version,
        sampled=tuple(bool(g) for g in generated),
    )
