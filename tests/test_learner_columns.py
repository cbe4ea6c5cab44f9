"""The learner's vocabulary projection on trained columns only equals the full computation."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from searchr1.core.builtins import resolve
from searchr1.plugins.local_model.learner import token_logprobs, trained_token_logprobs


def test_logprobs_on_selected_columns_match_every_position() -> None:
    model = AutoModelForCausalLM.from_pretrained(
        resolve("builtin:tiny-random"), dtype=torch.float32
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
    torch.testing.assert_close(some_BK, full_BT[:, columns_K], rtol=0, atol=1e-5)
