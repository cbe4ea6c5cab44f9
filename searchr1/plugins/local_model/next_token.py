"""Choosing the next token from logits: temperature, top-p, greedy, per-row seeds.

Called by :class:`~searchr1.plugins.local_model.sampler.BatchedSampler` once per decoding
step for every active row of a batch. Rows of one batch may come from different requests,
so temperature, top-p and the random source are per row. Implemented over logits directly
(no ``generate`` logits processors) so that no library default, such as ``top_k=50``, can
change the distribution.
"""

from __future__ import annotations

import torch


def sample_next(
    logits_RV: torch.Tensor,
    temperature_R: torch.Tensor,
    top_p_R: torch.Tensor,
    uniform_R: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob.

    ``uniform_R`` holds one U[0, 1) draw per row (the caller owns the random streams, so a
    seeded request reproduces regardless of what else shares its batch). Sampling is by
    inverse CDF over the (top-p truncated, renormalised) probabilities.
    """
    # At least float32 (half-precision log-softmax loses digits); float64 stays float64.
    logits_RV = logits_RV.to(torch.promote_types(logits_RV.dtype, torch.float32))
    temperature_R = temperature_R.to(logits_RV.dtype)
    greedy_R = temperature_R <= 0
    safe_t_R = torch.where(greedy_R, torch.ones_like(temperature_R), temperature_R)
    logp_RV = torch.log_softmax(logits_RV / safe_t_R[:, None], dim=-1)

    if bool(greedy_R.all()):
        tokens_R = logp_RV.argmax(dim=-1)
    else:
        probs_RV = logp_RV.exp()
        if bool((top_p_R < 1.0).any()):
            tokens_R = _sample_top_p(probs_RV, top_p_R, uniform_R)
        else:
            cdf_RV = probs_RV.cumsum(dim=-1)
            target_R = uniform_R * cdf_RV[:, -1]
            idx_R = torch.searchsorted(cdf_RV, target_R[:, None], right=True).squeeze(-1)
            tokens_R = idx_R.clamp(max=logits_RV.shape[-1] - 1)
        if bool(greedy_R.any()):
            tokens_R = torch.where(greedy_R, logp_RV.argmax(dim=-1), tokens_R)
    logprobs_R = logp_RV.gather(-1, tokens_R[:, None]).squeeze(-1)
    # Greedy rows report the untempered log-prob (their temperature was replaced by 1 above).
    return tokens_R, logprobs_R


def _sample_top_p(
    probs_RV: torch.Tensor, top_p_R: torch.Tensor, uniform_R: torch.Tensor
) -> torch.Tensor:
    """Nucleus sampling: keep the smallest prefix of tokens, by descending probability, whose
    mass reaches ``top_p`` (always at least one token), renormalise, draw."""
    sorted_RV, order_RV = probs_RV.sort(dim=-1, descending=True)
    mass_before_RV = sorted_RV.cumsum(dim=-1) - sorted_RV
    keep_RV = mass_before_RV < top_p_R[:, None]
    keep_RV[:, 0] = True
    kept_RV = sorted_RV * keep_RV
    cdf_RV = kept_RV.cumsum(dim=-1)
    target_R = uniform_R * cdf_RV[:, -1]
    idx_R = torch.searchsorted(cdf_RV, target_R[:, None], right=True)
    idx_R = idx_R.clamp(max=probs_RV.shape[-1] - 1)
    return order_RV.gather(-1, idx_R).squeeze(-1)


def row_generator(seed: int, sample_index: int) -> torch.Generator:
    """The random stream (on the CPU, whatever the model's device) of sample
    ``sample_index`` of a request with ``seed``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed((seed * 1_000_003 + sample_index) % (2**63 - 1))
    return gen
