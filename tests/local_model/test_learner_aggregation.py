"""The learner hands a loss each position's datum weight (``[train] loss_agg_mode``) and its
datum (GSPO's sequence ratio, ``[train.loss] importance_sampling_level``), through the real
packing of a micro-batch: a tiny float64 model on CPU, compared within ``numerics.RTOL64``.

The formulas themselves are checked against verl's and TRL's in
``tests/train/test_estimators.py``; here: a weight scales that datum's loss and gradient and
nothing else, and a sequence ratio averages over its own datum's positions only (one call of
two datums gives the sum of the two calls of one)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import RTOL64
from trainer_calls import forward_backward

from searchr1.core.config_schema import Config
from searchr1.core.types import Datum
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, ppo

TOKENS = [[5, 17, 33, 8, 90, 41, 7, 7, 12], [12, 7, 300, 52, 9, 9, 61]]
PROMPT_LEN = 4


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> LocalModelProvider:
    model_dir = build_small_tiny_model(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64)
    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 1.0, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(dataclasses.replace(config, plugins={}))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return p


def _datum(i: int, weight: float = 1.0) -> Datum:
    """Off-policy on purpose: sampler log-probs far from the policy's, different per datum,
    so each datum's sequence ratio is its own; an observation position inside."""
    tokens = TOKENS[i]
    n = len(tokens) - 1
    sampled = [False] * (PROMPT_LEN - 1) + [True] * (n - PROMPT_LEN + 1)
    sampled[PROMPT_LEN] = False  # an observation token
    adv = tuple((1.0 if i else -0.5) if s else 0.0 for s in sampled)
    sampler = tuple((-3.0 - i) if s else 0.0 for s in sampled)
    return Datum(
        tuple(tokens[:-1]),
        tuple(tokens[1:]),
        sampler,
        adv,
        f"t{i}",
        sampled=tuple(sampled),
        weight=weight,
    )


def _grads(p: LocalModelProvider, datums: list[Datum], level: str) -> tuple[float, list]:
    loss = NamedLoss("ppo", ppo, {"clip_low": 10.0, "clip_high": 10.0} | _level(level))
    result = forward_backward(p, datums, loss)
    grads = [q.grad.clone() for q in p.learner.params]
    p.learner.optimizer.zero_grad(set_to_none=True)
    return result.loss, grads


def _level(level: str) -> dict:
    return {} if level == "token" else {"importance_sampling_level": level}


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    scale = max(float(g.abs().max()) for g in b)
    assert scale > 0
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=RTOL64, atol=RTOL64 * scale)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_datum_weight_scales_its_loss_and_gradient(provider, level) -> None:
    loss_1, grads_1 = _grads(provider, [_datum(0)], level)
    loss_w, grads_w = _grads(provider, [_datum(0, weight=0.125)], level)
    assert loss_w == pytest.approx(0.125 * loss_1, rel=RTOL64)
    _close(grads_w, [0.125 * g for g in grads_1])
    both_loss, both = _grads(provider, [_datum(0, 0.125), _datum(1, 2.0)], level)
    loss_2, grads_2 = _grads(provider, [_datum(1)], level)
    assert both_loss == pytest.approx(0.125 * loss_1 + 2.0 * loss_2, rel=RTOL64)
    _close(both, [0.125 * a + 2.0 * b for a, b in zip(grads_1, grads_2, strict=True)])


def test_a_sequence_ratio_reads_only_its_own_datum(provider) -> None:
    joint_loss, joint = _grads(provider, [_datum(0), _datum(1)], "sequence")
    loss_0, grads_0 = _grads(provider, [_datum(0)], "sequence")
    loss_1, grads_1 = _grads(provider, [_datum(1)], "sequence")
    assert joint_loss == pytest.approx(loss_0 + loss_1, rel=RTOL64)
    _close(joint, [a + b for a, b in zip(grads_0, grads_1, strict=True)])
    # and the sequence ratio is not the token one here (off-policy, unequal log-ratios)
    token_loss, _ = _grads(provider, [_datum(0), _datum(1)], "token")
    assert abs(token_loss - joint_loss) > 1e-3 * abs(joint_loss)
