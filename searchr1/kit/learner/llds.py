"""The LLDS regularizer (lazy likelihood displacement, arXiv 2512.04220), an option of the
local learner (``[model.local] llds_coef``, ``llds_gate``; docs/training.md, "Collapse").

For the tokens the policy sampled with a non-negative advantage (the preserving set), the
term is ``coef * sum_t max(0, old_t - lp_t)`` over the tokens of each *unit* whose summed
``old - lp`` over its preserving tokens is positive (its likelihood fell), where ``old_t`` is
the log-prob of the policy that sampled the token and ``lp_t`` the learner's. A unit is an
action (``gate = "action"``: one assistant turn, a run of sampled tokens) or the whole
response (``"response"``). Summed like the policy loss; the cold start's loss is left alone.
"""

from __future__ import annotations

import torch


def action_segments(trained_BT: torch.Tensor) -> torch.Tensor:
    """The unit id of each trained position, in row-major order of ``trained_BT``: each run
    of consecutive trained positions of a row (one assistant turn) gets its own id."""
    before_BT = torch.zeros_like(trained_BT)
    before_BT[:, 1:] = trained_BT[:, :-1]
    starts = (trained_BT & ~before_BT).flatten().long().cumsum(0).view_as(trained_BT) - 1
    return starts[trained_BT]


def response_segments(trained_BT: torch.Tensor) -> torch.Tensor:
    """The row of each trained position, in row-major order of ``trained_BT``."""
    return trained_BT.nonzero()[:, 0]


def llds_penalty(
    logprobs_T: torch.Tensor,
    old_logprobs_T: torch.Tensor,
    advantages_T: torch.Tensor,
    segments_T: torch.Tensor,
    coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(coef * penalty, {llds_sum, llds_tokens})`` of the module docstring; ``segments_T``
    numbers the unit of each token (:func:`action_segments`, :func:`response_segments`).
    ``llds_sum`` is the unweighted penalty, ``llds_tokens`` the tokens it penalised."""
    fell_T = old_logprobs_T.detach() - logprobs_T  # > 0 where the token's likelihood fell
    keep_T = (advantages_T >= 0).to(fell_T.dtype)
    units = int(segments_T.max()) + 1 if segments_T.numel() else 0
    unit_fell = torch.zeros(units, dtype=fell_T.dtype, device=fell_T.device)
    unit_fell.index_add_(0, segments_T, fell_T.detach() * keep_T)
    gate_T = (unit_fell > 0)[segments_T].to(fell_T.dtype)
    penalty_T = fell_T.clamp(min=0.0) * keep_T * gate_T
    active = (penalty_T.detach() > 0).sum()
    return coef * penalty_T.sum(), {
        "llds_sum": float(penalty_T.detach().sum()),
        "llds_tokens": float(active),
    }
