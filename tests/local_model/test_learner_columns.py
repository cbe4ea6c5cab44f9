"""The learner's vocabulary projection on trained columns only equals the full computation
(in float64: two orders of the same sums, see ``numerics``)."""

from __future__ import annotations

import torch
from numerics import assert_same64, assert_same_grads64
from transformers import AutoModelForCausalLM

from searchr1.core.assets import resolve
from searchr1.core.plugins import load_registry
from searchr1.kit.learner.learner import token_logprobs, trained_token_logprobs


def test_logprobs_on_selected_columns_match_every_position() -> None:
    model = AutoModelForCausalLM.from_pretrained(
        resolve("builtin:tiny-random", load_registry().assets), dtype=torch.float64
    )
    gen = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(3, 200, (3, 12), generator=gen)
    targets_BT = torch.randint(3, 200, (3, 12), generator=gen)
    mask_BT = torch.ones(3, 12, dtype=torch.long)
    mask_BT[2, 9:] = 0  # a right-padded row
    columns_K = torch.tensor([4, 5, 9, 10])
    full_BT = token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7)
    some_BK = trained_token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7, columns_K)
    assert some_BK.shape == (3, 4)
    assert_same64(some_BK, full_BT[:, columns_K])


def test_gradients_through_selected_columns_match_every_position() -> None:
    """Training uses the gradient, not only the values: the same weighted sum of log-probs
    taken on the trained columns and on the full tensor gives the same gradient on every
    weight (a column mix-up, a detached logsumexp or a dropped temperature would not)."""
    model = AutoModelForCausalLM.from_pretrained(
        resolve("builtin:tiny-random", load_registry().assets), dtype=torch.float64
    )
    gen = torch.Generator().manual_seed(1)
    ids_BT = torch.randint(3, 200, (2, 10), generator=gen)
    targets_BT = torch.randint(3, 200, (2, 10), generator=gen)
    mask_BT = torch.ones(2, 10, dtype=torch.long)
    mask_BT[1, 8:] = 0
    columns_K = torch.tensor([2, 3, 7])
    weights_BK = torch.randn(2, 3, generator=gen, dtype=torch.float64)

    def grads(logprobs_BK: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (weights_BK * logprobs_BK).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full = grads(token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7)[:, columns_K])
    some = grads(trained_token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7, columns_K))
    assert_same_grads64(some, full)
    # The temperature enters the gradient: another temperature gives another gradient.
    hot = grads(trained_token_logprobs(model, ids_BT, mask_BT, targets_BT, 1.3, columns_K))
    assert any(not torch.allclose(hot[n], g, rtol=1e-3, atol=1e-6) for n, g in full.items())
