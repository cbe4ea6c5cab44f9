"""Rows that share an untrained prefix (a GRPO group's prompt) run it once in the learner:
the log-probs and every gradient equal the unshared path's (in float64: see ``numerics``), with prefixes of
different lengths in one micro-batch, rows of different lengths and rows sharing with no
one; models it does not fit (Gated DeltaNet state, a sliding window) keep the unshared path."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_models import build_family
from numerics import RTOL64_F32_ATTENTION, assert_same64, assert_same_grads64
from transformers import AutoModelForCausalLM

from searchr1.core.types import Datum, LossOutput
from searchr1.kit.learner.chunked_logprobs import chunked_token_logprobs
from searchr1.kit.learner.learner import Learner
from searchr1.kit.learner.shared_prefix import (
    can_share_prefixes,
    prefix_groups,
    shared_prefix_logprobs,
)


def _rows(seed: int) -> tuple[list[list[int]], list[int]]:
    """3 groups (prompts of 9, 12, 15 tokens) x 3 samples, plus one row of its own."""
    rng = random.Random(seed)
    rows, first = [], []
    for q in range(3):
        prompt = [rng.randrange(3, 200) for _ in range(9 + 3 * q)]
        for _ in range(3):
            rows.append(prompt + [rng.randrange(3, 200) for _ in range(rng.randrange(2, 8))])
            first.append(len(prompt) - 1)
    rows.append([rng.randrange(3, 200) for _ in range(14)])
    first.append(10)
    return rows, first


def _tensors(rows: list[list[int]], first: list[int]) -> tuple[torch.Tensor, ...]:
    b, t = len(rows), max(map(len, rows)) - 1
    ids_BT = torch.zeros(b, t, dtype=torch.long)
    targets_BT, mask_BT = torch.zeros_like(ids_BT), torch.zeros_like(ids_BT)
    trained_BT = torch.zeros(b, t, dtype=torch.bool)
    for i, r in enumerate(rows):
        n = len(r) - 1
        ids_BT[i, :n], targets_BT[i, :n] = torch.tensor(r[:-1]), torch.tensor(r[1:])
        mask_BT[i, :n] = 1
        trained_BT[i, first[i] : n] = True
    return ids_BT, targets_BT, mask_BT, trained_BT


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_shared_prefixes_give_the_unshared_logprobs_and_gradients(
    family: str, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        build_family(family, tmp_path / family), dtype=torch.float64
    ).eval()
    assert can_share_prefixes(model)
    rows, first = _rows(0)
    ids_BT, targets_BT, mask_BT, trained_BT = _tensors(rows, first)
    groups = prefix_groups([r[:-1] for r in rows], first)
    assert groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    weights_N = torch.randn(
        int(trained_BT.sum()), generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )

    def run(shared: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        if shared:
            lp_N = shared_prefix_logprobs(
                model,
                ids_BT,
                [len(r) - 1 for r in rows],
                targets_BT,
                trained_BT,
                groups,
                [first[g[0]] for g in groups],
                0.7,
                4,
            )
        else:
            lp_N = chunked_token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7, trained_BT, 4)
        assert lp_N is not None
        (weights_N * lp_N).sum().backward()
        return lp_N.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full_N, full = run(shared=False)
    ours_N, ours = run(shared=True)
    assert_same64(ours_N, full_N)
    assert_same_grads64(ours, full, rtol=RTOL64_F32_ATTENTION)


def _loss(logprobs_T: torch.Tensor, inputs: Any) -> LossOutput:
    return LossOutput(loss=-(logprobs_T * inputs.advantages_T).sum(), metrics={})


def _learner(model: Any, share: bool) -> Learner:
    return Learner(
        model,
        device=torch.device("cpu"),
        model_lock=threading.Lock(),
        context_length=1024,
        vocab_size=model.config.vocab_size,
        temperature=0.7,
        pad_token_id=0,
        share_prefixes=share,
    )


@pytest.mark.parametrize(
    ("family", "shares"),
    [("qwen3", True), pytest.param("qwen3_5", False, marks=pytest.mark.slow)],
)
def test_learner_shares_prefixes_where_the_model_allows(
    family: str, shares: bool, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        build_family(family, tmp_path / family), dtype=torch.float64
    )
    rows, first = _rows(2)
    datums = []
    for r, f in zip(rows, first, strict=True):
        n = len(r) - 1
        adv = [0.0] * f + [1.0 if n % 2 else -1.0] * (n - f)
        datums.append(Datum(tuple(r[:-1]), tuple(r[1:]), (-3.0,) * n, tuple(adv)))
    learner = _learner(model, share=True)
    assert (learner._shared_ok is None) is shares
    shared_loss = learner.forward_backward(datums, _loss).loss
    assert learner._shared_ok is shares
    plain_loss = _learner(model, share=False).forward_backward(datums, _loss).loss
    assert shared_loss == pytest.approx(plain_loss, rel=RTOL64_F32_ATTENTION)


def test_no_sharing_under_gradient_checkpointing(tmp_path: Path) -> None:
    """transformers drops the KV cache when layers checkpoint: the shared path declines
    (``None``, the learner then runs every row whole) instead of wasting a prefix forward."""
    model = AutoModelForCausalLM.from_pretrained(
        build_family("qwen3", tmp_path / "qwen3"), dtype=torch.float64
    )
    model.gradient_checkpointing_enable()
    rows, first = _rows(3)
    ids_BT, targets_BT, _, trained_BT = _tensors(rows, first)
    groups = prefix_groups([r[:-1] for r in rows], first)
    assert groups is not None
    out = shared_prefix_logprobs(
        model,
        ids_BT,
        [len(r) - 1 for r in rows],
        targets_BT,
        trained_BT,
        groups,
        [first[g[0]] for g in groups],
        0.7,
        4,
    )
    assert out is None
