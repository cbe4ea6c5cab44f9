"""The learner's chunked vocabulary projection over each row's trained positions gives the
model's own forward's values and gradients (B x K x V logits over the union of trained
columns, the learner's fallback), in
float64 (two orders of the same sums: see ``numerics``), on tiny random models of real architectures, including ones that rescale logits after
``lm_head`` (Gemma soft-capping, Cohere's logit_scale, Granite's logits_scaling) and tied
embeddings; a model that scales in a way the learner does not know falls back."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf
from arch_models import family_config
from numerics import assert_same64, assert_same_grads64
from transformers import AutoModelForCausalLM

from searchr1.core.types import Datum, LossOutput
from searchr1.kit.learner.chunked_logprobs import (
    chunked_token_logprobs,
    matches_model_logits,
)
from searchr1.kit.learner.learner import Learner, trained_token_logprobs

VOCAB = 300
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.2,
)


def _config(name: str) -> Any:
    if name == "qwen3_5_tied":
        config = family_config("qwen3_5", VOCAB, 2)
        config.tie_word_embeddings = True
        return config
    if name == "gemma3_softcap":
        # A small cap so that it bends these tiny logits (|logit| ~ 3) measurably.
        return tf.Gemma3TextConfig(final_logit_softcapping=2.0, sliding_window=8, **COMMON)
    if name == "cohere":
        return tf.CohereConfig(logit_scale=0.5, **COMMON)
    if name == "granite":
        return tf.GraniteConfig(logits_scaling=4.0, **COMMON)
    if name == "llama":
        return tf.LlamaConfig(tie_word_embeddings=False, **COMMON)
    raise ValueError(name)


def _model(name: str, folder: Path) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_config(name))
    model.save_pretrained(folder / name)
    return AutoModelForCausalLM.from_pretrained(folder / name, dtype=torch.float64).eval()


def _batch(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    ids_BT = torch.randint(3, VOCAB, (3, 14), generator=gen)
    targets_BT = torch.randint(3, VOCAB, (3, 14), generator=gen)
    mask_BT = torch.ones(3, 14, dtype=torch.long)
    mask_BT[2, 10:] = 0  # a right-padded row
    trained_BT = torch.zeros(3, 14, dtype=torch.bool)
    trained_BT[0, [3, 4, 5, 11]] = True  # rows train different columns: the union is wider
    trained_BT[1, [6, 7, 12, 13]] = True
    trained_BT[2, [2, 9]] = True
    return ids_BT, targets_BT, mask_BT, trained_BT


def _old(model: Any, ids_BT: Any, targets_BT: Any, mask_BT: Any, trained_BT: Any) -> Any:
    columns_K = trained_BT.any(dim=0).nonzero().squeeze(-1)
    logprobs_BK = trained_token_logprobs(model, ids_BT, mask_BT, targets_BT, 0.7, columns_K)
    return logprobs_BK[trained_BT[:, columns_K]]


ARCHITECTURES = ["qwen3_5_tied", "gemma3_softcap", "cohere", "granite", "llama"]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_chunked_logprobs_and_gradients_equal_the_old_path(name: str, tmp_path: Path) -> None:
    model = _model(name, tmp_path)
    ids_BT, targets_BT, mask_BT, trained_BT = _batch(0)
    weights_N = torch.randn(
        int(trained_BT.sum()), generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )

    def run(new: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        if new:  # chunks of 3 cross row boundaries
            lp_N = chunked_token_logprobs(
                model, ids_BT, mask_BT, targets_BT, 0.7, trained_BT, chunk=3
            )
        else:
            lp_N = _old(model, ids_BT, targets_BT, mask_BT, trained_BT)
        (weights_N * lp_N).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return lp_N.detach(), grads

    old_N, old_grads = run(new=False)
    new_N, new_grads = run(new=True)
    assert new_N.shape == (10,)
    assert_same64(new_N, old_N, name)
    assert_same_grads64(new_grads, old_grads)
    # The scaling is really applied: without it the check against the model's logits fails
    # for the scaled architectures (so this test would catch a dropped scaling).
    ok, diff = matches_model_logits(
        model, ids_BT[0], targets_BT[0], trained_BT[0].nonzero().squeeze(-1), 0.7
    )
    assert ok and diff < 1e-5


class _HalvedLlama(tf.LlamaForCausalLM):
    """A real Llama whose forward halves its logits: a scaling the learner does not know."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out


def _datums() -> list[Datum]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(3):
        ids = torch.randint(3, VOCAB, (12,), generator=gen).tolist()
        adv = [0.0] * 8 + [1.0 if i % 2 else -1.0] * 4
        out.append(Datum(tuple(ids[:-1]), tuple(ids[1:]), (-5.0,) * 11, tuple(adv[1:])))
    return out


def _loss(logprobs_T: torch.Tensor, inputs: Any) -> LossOutput:
    return LossOutput(loss=-(logprobs_T * inputs.advantages_T).sum(), metrics={})


def _learner(model: Any, logit_chunk: int) -> Learner:
    return Learner(
        model,
        device=torch.device("cpu"),
        model_lock=threading.Lock(),
        context_length=256,
        vocab_size=VOCAB,
        temperature=0.7,
        pad_token_id=0,
        logit_chunk=logit_chunk,
    )


def _own_forward_loss(model: Any) -> float:
    """:func:`_loss` from the model's own full forward, one datum at a time."""
    total = 0.0
    with torch.no_grad():
        for d in _datums():
            logits_TV = model(input_ids=torch.tensor([d.input_tokens])).logits[0] / 0.7
            logprobs_T = logits_TV.log_softmax(-1).gather(
                -1, torch.tensor(d.target_tokens)[:, None]
            )[:, 0]
            total += float(-(logprobs_T * torch.tensor(d.advantages, dtype=torch.float64)).sum())
    return total


@pytest.mark.parametrize("logit_chunk", [2, 0])  # 0: one projection for all positions
def test_unknown_logit_scaling_falls_back_to_the_models_own_logits(logit_chunk: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _HalvedLlama(_config("llama")).double()
    learner = _learner(model, logit_chunk=logit_chunk)
    result = learner.forward_backward(_datums(), _loss)
    assert learner._chunked_ok is False
    assert result.loss == pytest.approx(_own_forward_loss(model), rel=1e-9)
    # A model it does know takes the chunked path, with the model's own loss.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        plain = tf.LlamaForCausalLM(_config("llama")).double()
    known = _learner(plain, logit_chunk=logit_chunk)
    loss_known = known.forward_backward(_datums(), _loss).loss
    assert known._chunked_ok is True
    assert loss_known == pytest.approx(_own_forward_loss(plain), rel=1e-9)
    assert abs(loss_known - result.loss) > 1e-3  # the halving really changes the loss


def test_lora_on_lm_head_takes_autograd_per_chunk_with_the_same_gradients(
    tmp_path: Path,
) -> None:
    """A head that is not a plain Linear (here peft's LoRA layer on ``lm_head``) goes through
    autograd with checkpointing per chunk; values and LoRA gradients equal the old path's."""
    from peft import LoraConfig, get_peft_model

    base = _model("gemma3_softcap", tmp_path)
    config = LoraConfig(r=4, target_modules=["q_proj", "lm_head"], init_lora_weights=False)
    model = get_peft_model(base, config)
    head = model.get_base_model().get_output_embeddings()
    assert type(head) is not torch.nn.Linear
    ids_BT, targets_BT, mask_BT, trained_BT = _batch(2)
    weights_N = torch.randn(
        int(trained_BT.sum()), generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )

    def run(new: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        if new:
            lp_N = chunked_token_logprobs(
                model, ids_BT, mask_BT, targets_BT, 0.7, trained_BT, chunk=4
            )
        else:
            lp_N = _old(model, ids_BT, targets_BT, mask_BT, trained_BT)
        (weights_N * lp_N).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return lp_N.detach(), grads

    old_N, old_grads = run(new=False)
    new_N, new_grads = run(new=True)
    assert_same64(new_N, old_N)
    assert any("lm_head" in n for n in old_grads)
    assert_same_grads64(new_grads, old_grads)
