"""The KL term's reference policy in the local learner (tiny model, CPU, float64): the base model
with the adapter disabled until a reference is pinned, the pinned adapter after, kept across
a checkpoint; and a KL term that changes the gradient exactly where the policy left the
reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import RTOL64
from trainer_calls import forward_backward, load_state

from searchr1.core.config_schema import Config
from searchr1.core.types import Datum, LossInputs, LossOutput
from searchr1.kit.learner.learner import trained_token_logprobs
from searchr1.kit.learner.loading import enable_checkpointing
from searchr1.kit.learner.reference import REFERENCE_FILE
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

TEMPERATURE = 0.8
PROMPTS = [[5, 17, 33, 8, 90, 41, 7, 7, 12], [12, 7, 300, 52, 9, 9, 61]]
PROMPT_LEN = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_tiny_model(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64)


def _provider(model_dir: Path) -> LocalModelProvider:
    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": TEMPERATURE, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(dataclasses.replace(config, plugins={}))
    # A trained-looking adapter: with B = 0 the adapter would change nothing.
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return p


def _datums() -> list[Datum]:
    out = []
    for i, tokens in enumerate(PROMPTS):
        n = len(tokens) - 1
        adv = [0.0] * (PROMPT_LEN - 1) + [1.0 if i else -1.0] * (n - PROMPT_LEN + 1)
        out.append(Datum(tuple(tokens[:-1]), tuple(tokens[1:]), (0.0,) * n, tuple(adv), f"t{i}"))
    return out


class Recorded:
    """An importance-sampling loss that keeps the reference log-probs it was given."""

    def __init__(self, kl_coef: float) -> None:
        self.reference: list[torch.Tensor] = []
        self.loss = NamedLoss("importance_sampling", self._fn, {"kl_coef": kl_coef})

    def _fn(self, logprobs_T: torch.Tensor, inputs: LossInputs, kl_coef: float) -> LossOutput:
        if inputs.reference_logprobs_T is not None:
            self.reference.append(inputs.reference_logprobs_T.clone())
        return importance_sampling(logprobs_T, inputs, kl_coef=kl_coef)


def _step(p: LocalModelProvider, kl_coef: float) -> tuple[dict, list[torch.Tensor], Recorded]:
    """One forward_backward; its metrics, the LoRA gradients (then zeroed) and the loss."""
    loss = Recorded(kl_coef)
    result = forward_backward(p, _datums(), loss.loss)
    grads = [q.grad.clone() for q in p.learner.params]
    p.learner.optimizer.zero_grad(set_to_none=True)
    return dict(result.metrics), grads, loss


def _trained_logprobs(
    p: LocalModelProvider, datums: list[Datum] | None = None, prompt_len: int = PROMPT_LEN
) -> torch.Tensor:
    """The model's log-probs of every datum's trained tokens (``_datums()`` by default),
    row by row (no learner code)."""
    out = []
    with torch.no_grad():
        for d in _datums() if datums is None else datums:
            ids = torch.tensor([d.input_tokens])
            columns = torch.arange(prompt_len - 1, len(d))
            lp = trained_token_logprobs(
                p.model,
                ids,
                torch.ones_like(ids),
                torch.tensor([d.target_tokens]),
                TEMPERATURE,
                columns,
            )
            out.append(lp[0])
    return torch.cat(out)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=RTOL64, atol=RTOL64))


def test_reference_is_the_base_until_pinned_then_the_pinned_adapter(
    model_dir: Path, tmp_path: Path
) -> None:
    p = _provider(model_dir)
    with p.model.disable_adapter():
        base = _trained_logprobs(p)
    policy = _trained_logprobs(p)
    assert not _close(base, policy)  # the adapter matters

    # Not pinned: the reference is the base model, and the KL term adds its gradient.
    metrics, grads_kl, loss = _step(p, kl_coef=0.5)
    assert _close(torch.cat(loss.reference), base)
    assert metrics["kl_sum"] > 1e-4
    _, grads_plain, plain = _step(p, kl_coef=0.0)
    assert plain.reference == []  # no reference forward without a KL term
    assert any(not _close(a, b) for a, b in zip(grads_kl, grads_plain, strict=True))

    # Pinned: the reference is this adapter; the KL term is 0 and leaves the gradient as is.
    p.capabilities.kl_reference()
    metrics, grads_pinned, loss = _step(p, kl_coef=0.5)
    assert _close(torch.cat(loss.reference), policy)
    assert metrics["kl_sum"] == pytest.approx(0.0, abs=1e-12)
    assert all(_close(a, b) for a, b in zip(grads_pinned, grads_plain, strict=True))

    # The adapter moves; the reference stays, and a checkpoint carries it to a new process.
    with torch.no_grad():
        for q in p.learner.params:
            q.add_(0.05)
    p.save_state(str(tmp_path / "state"))
    assert (tmp_path / "state" / REFERENCE_FILE).is_file()
    fresh = _provider(model_dir)
    load_state(fresh, str(tmp_path / "state"))
    metrics, _, loss = _step(fresh, kl_coef=0.5)
    assert _close(torch.cat(loss.reference), policy)
    assert metrics["kl_sum"] > 1e-4


def test_a_degenerate_groups_datum_is_trained_by_the_kl_term_alone(model_dir: Path) -> None:
    """Advantage 0 everywhere (a group whose rewards were all equal), the policy's tokens
    marked ``sampled``: no policy gradient, and the KL term reads every sampled token, so
    its sum is the k3 of the policy against the reference (the base) there, in float64."""
    p = _provider(model_dir)
    with p.model.disable_adapter():
        base = _trained_logprobs(p)
    policy = _trained_logprobs(p)
    degenerate = [
        dataclasses.replace(
            d, advantages=(0.0,) * len(d), sampled=tuple(a != 0 for a in d.advantages)
        )
        for d in _datums()
    ]

    for kl_coef in (0.0, 0.5):
        loss = Recorded(kl_coef)
        result = forward_backward(p, degenerate, loss.loss)
        grads = [q.grad for q in p.learner.params]
        if kl_coef == 0.0:
            assert "kl_sum" not in result.metrics
            assert all(g is None or not g.any() for g in grads)  # nothing to learn
        else:
            d = base - policy
            assert result.metrics["kl_tokens"] == len(policy)
            assert result.metrics["kl_sum"] == pytest.approx(
                float((d.exp() - d - 1).sum()), rel=RTOL64
            )
            assert result.metrics["tokens"] == 0.0  # no token of the policy term
            assert any(g is not None and g.abs().max() > 1e-6 for g in grads)
        p.learner.optimizer.zero_grad(set_to_none=True)


def _group(prompt_len: int = 20, rows: int = 4, rest: int = 6) -> list[Datum]:
    """One GRPO group: ``rows`` datums sharing a ``prompt_len``-token prompt, each with
    ``rest`` sampled tokens of its own (advantages +1 / -1)."""
    prompt = [(7 * i) % 600 + 3 for i in range(prompt_len)]
    out = []
    for r in range(rows):
        tokens = prompt + [(31 * r + 11 * j) % 600 + 3 for j in range(rest)]
        n = len(tokens) - 1
        adv = [0.0] * (prompt_len - 1) + [1.0 if r % 2 else -1.0] * (n - prompt_len + 1)
        out.append(Datum(tuple(tokens[:-1]), tuple(tokens[1:]), (-3.0,) * n, tuple(adv), f"r{r}"))
    return out


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_groups_shared_prompt_runs_once_per_chunk_and_for_the_reference(
    model_dir: Path, checkpointing: bool
) -> None:
    """4 rows share a 19-token prefix and have 6 positions each of their own (25 in all).
    Under a budget of 60 positions the 4 rows are one chunk when the prompt runs once
    (19 + 4 x 6 = 43) and two chunks of 2 rows (50 each) when every row runs whole, which is
    what the forward with gradient does under gradient checkpointing. The KL reference's
    forward takes no gradient, so it runs the prompt once either way; its log-probs are the
    base model's, row by row, and the loss is the one every row run whole gives."""
    from searchr1.kit.learner.chunked_logprobs import causal_lm

    p = _provider(model_dir)
    if checkpointing:
        enable_checkpointing(p.model.get_base_model())
    p.learner.chunk_tokens = 60
    datums = _group()
    forward_backward(p, datums, Recorded(0.5).loss)  # the first call checks the shared path
    assert p.learner._shared_ok is True
    p.learner.optimizer.zero_grad(set_to_none=True)

    positions: list[int] = []
    decoder = causal_lm(p.model).get_decoder()
    hook = decoder.register_forward_pre_hook(
        lambda _m, _a, kw: positions.append(kw["input_ids"].numel()), with_kwargs=True
    )
    loss = Recorded(0.5)
    try:
        shared = forward_backward(p, datums, loss.loss)
    finally:
        hook.remove()
    # Per chunk, the reference's forward, then the policy's: the prefix once, then the rows'
    # own positions; or each row whole.
    if checkpointing:
        assert positions == [19, 2 * 6, 2 * 25] * 2
    else:
        assert positions == [19, 4 * 6] * 2
    with p.model.disable_adapter():
        base = _trained_logprobs(p, datums, prompt_len=20)
    assert _close(torch.cat(loss.reference), base)
    p.learner.optimizer.zero_grad(set_to_none=True)

    # A model the chunked path does not fit (its own logits instead) never shares: chunks
    # are cut by whole rows, or they would hold twice the positions the budget allows.
    p.learner._chunked_ok = False
    positions.clear()
    hook = decoder.register_forward_pre_hook(
        lambda _m, _a, kw: positions.append(kw["input_ids"].numel()), with_kwargs=True
    )
    try:
        fallback = forward_backward(p, datums, Recorded(0.5).loss)
    finally:
        hook.remove()
    assert positions == [2 * 25] * 4
    p.learner.optimizer.zero_grad(set_to_none=True)
    p.learner._chunked_ok = True

    p.learner._shared_ok = False  # every row whole
    whole = forward_backward(p, datums, Recorded(0.5).loss)
    assert fallback.loss == pytest.approx(whole.loss, rel=RTOL64)
    assert shared.loss == pytest.approx(whole.loss, rel=RTOL64)
    assert shared.metrics["kl_sum"] == pytest.approx(whole.metrics["kl_sum"], rel=RTOL64)
