"""The ``local`` provider on tiny random-init models of real decoder families.

Each family is built inside the test (transformers config class, random weights,
``save_pretrained`` next to the built-in tokenizer) and loaded by path through
``LocalModelProvider.from_config``, with ``target_modules = "all-linear"``: Qwen3 (full
attention), Qwen3.5 and Qwen3-Next (Gated DeltaNet linear attention in 3 of 4 layers; Next
also mixture-of-experts), Mistral with a sliding window and Gemma 3 with sliding and full
layers mixed (both take the sampler's general path), Qwen3-MoE and Llama. For each: concurrent sampling with per-request seeds independent of batch mates,
sampler/learner log-prob agreement, one training step, save and load; and a later turn that
continues a retained cache samples exactly what a full prefill samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from arch_models import FAMILIES, build_family
from numerics import FLOAT32_KERNEL_FAMILIES, LOGPROB_TOL_F32, RTOL64
from trainer_calls import forward_backward, load_state, optim_step

from searchr1.core.config_schema import Config
from searchr1.core.types import AdamParams, Datum, SamplingParams
from searchr1.plugins.local_model import kv_cache
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

TEMPERATURE = 0.8
NO_FLOAT64 = ("qwen3_next", "qwen3_moe")  # the mixture-of-experts grouped matmul


def _tolerance(family: str) -> float:
    """Sampler vs learner log-probs: float64 equality (log-probs are at most ~20 in
    magnitude), or the float32-kernel bound derived in ``numerics``."""
    return LOGPROB_TOL_F32 if family in FLOAT32_KERNEL_FAMILIES else 20 * RTOL64


def _config(path: Path, **local: object) -> Config:
    # float64 where the family's kernels take it: two computations of the same maths then
    # agree to ~1e-15 on any CPU (see ``numerics``).
    dtype = "float32" if path.name.startswith(NO_FLOAT64) else "float64"
    config = Config().replace(
        model={"base_model": str(path), "temperature": TEMPERATURE, "dtype": dtype},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ("all-linear",)},
    )
    return dataclasses.replace(config, plugins={"model.local": {"batch_wait_ms": 0.0, **local}})


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    path = build_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, path


@pytest.fixture()
def provider(family: tuple) -> Iterator[LocalModelProvider]:
    # Gradient checkpointing as on a GPU (its default there), so the training step below
    # also proves every family recomputes its activations correctly.
    p = LocalModelProvider.from_config(_config(family[1], gradient_checkpointing=True))
    # LoRA B starts at zero; perturb it so the adapter path is exercised too.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    yield p
    p.close()


def _prompt(p: LocalModelProvider, text: str) -> list[int]:
    return p.tokenizer.encode(text)


def _datums(prompts: list[list[int]], results: list) -> list[Datum]:
    datums = []
    for prompt, group in zip(prompts, results, strict=True):
        for s in group:
            full = prompt + list(s.tokens)
            pad = len(prompt) - 1
            datums.append(
                Datum(
                    tuple(full[:-1]),
                    tuple(full[1:]),
                    (0.0,) * pad + s.logprobs,
                    (0.0,) * pad + (1.0,) * len(s.tokens),
                    trajectory_id="t",
                )
            )
    return datums


def test_family_samples_trains_saves_and_loads(
    family: tuple, provider: LocalModelProvider, tmp_path: Path
) -> None:
    name, path = family
    prompts = [
        _prompt(provider, "Who wrote the book about the old town?"),
        _prompt(provider, "Where?"),
    ]
    seeded = SamplingParams(max_tokens=10, temperature=TEMPERATURE, seed=7)
    alone = asyncio.run(provider.sample(prompts[0], 2, seeded))

    async def together() -> list:
        return await asyncio.gather(
            provider.sample(prompts[0], 2, seeded),
            provider.sample(prompts[1], 3, SamplingParams(max_tokens=12, temperature=TEMPERATURE)),
        )

    results = asyncio.run(together())
    # Per-request seeds: the same samples whatever shares the batch.
    assert [s.tokens for s in results[0]] == [s.tokens for s in alone], name
    assert results[0][0].tokens != results[0][1].tokens
    assert [len(g) for g in results] == [2, 3]

    # The learner's log-probs of the sampled tokens equal the sampler's.
    datums = _datums(prompts, results)
    loss = NamedLoss("importance_sampling", importance_sampling)
    before = {
        n: p.detach().clone() for n, p in provider.model.named_parameters() if p.requires_grad
    }
    out = forward_backward(provider, datums, loss)
    assert out.metrics["mismatch/logprob_diff_max"] <= _tolerance(name), name
    assert torch.isfinite(torch.tensor(out.loss))

    base = provider.model.get_base_model()
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    # One training step moves the LoRA weights.
    optim_step(provider, AdamParams(learning_rate=1e-2))
    after = {n: p.detach() for n, p in provider.model.named_parameters() if p.requires_grad}
    assert any(not torch.equal(before[n], after[n]) for n in before), name

    # Save, then a fresh provider on the same base model loads the same adapter and samples
    # the same seeded tokens.
    provider.save_state(str(tmp_path / "ckpt"))
    want = asyncio.run(provider.sample(prompts[0], 2, seeded))
    fresh = LocalModelProvider.from_config(_config(path))
    try:
        load_state(fresh, str(tmp_path / "ckpt"))
        assert fresh.learner.step == 1
        got = asyncio.run(fresh.sample(prompts[0], 2, seeded))
    finally:
        fresh.close()
    assert [s.tokens for s in got] == [s.tokens for s in want], name


def test_a_later_turn_continues_the_retained_cache(
    family: tuple, provider: LocalModelProvider
) -> None:
    """Turn 2 = turn 1's prompt + sampled tokens + an observation: with reuse only the
    observation is prefilled, and the samples are those of a full prefill."""
    name, path = family
    stats = provider.sampler.stats
    first = _prompt(provider, "Who painted the bridge?")
    params = SamplingParams(max_tokens=8, temperature=TEMPERATURE, seed=3)
    (turn1,) = asyncio.run(provider.sample(first, 1, params))
    observation = _prompt(provider, " <information> the old town </information>")
    second = first + list(turn1.tokens) + observation
    prefill_before = stats.prefill_tokens
    (reused,) = asyncio.run(provider.sample(second, 1, params))
    prefilled = stats.prefill_tokens - prefill_before

    plain = LocalModelProvider.from_config(_config(path, reuse_caches=False))
    try:
        plain.model.load_state_dict(provider.model.state_dict())
        (full,) = asyncio.run(plain.sample(second, 1, params))
    finally:
        plain.close()
    assert reused.tokens == full.tokens, name
    assert reused.logprobs == pytest.approx(full.logprobs, abs=_tolerance(name))
    cache = _probe_cache(provider)
    # The fast path covers full attention and linear attention (Qwen3.5, Qwen3-Next); the
    # sliding-window cache takes the general path.
    assert kv_cache.editable(cache) == (name not in ("mistral_sliding", "gemma3_mixed"))
    if kv_cache.editable(cache):
        # Only the observation and the last sampled token (never fed) are new.
        assert prefilled == len(observation) + 1, name
    else:  # the general path (sliding windows) prefills the whole history
        assert prefilled == len(second), name


def _probe_cache(p: LocalModelProvider) -> object:
    with torch.inference_mode():
        out = p.model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True)
    return out.past_key_values


def test_chunked_prefill_and_concurrent_continuations_match_the_learner(family: tuple) -> None:
    """Prompts of different lengths prefilled in 16-column chunks (a short prompt is all
    padding in the first chunks: linear-attention state must not move), then every
    trajectory's second turn, with observations of different lengths, continuing its
    retained cache concurrently: the learner's log-probs over the whole trajectories equal
    the sampler's."""
    name, path = family
    p = LocalModelProvider.from_config(_config(path, prefill_chunk_tokens=16))
    try:
        prompts = [
            _prompt(p, "Who wrote the book about the old town by the river and its bridge? " * 2),
            _prompt(p, "Where?"),
        ]
        assert len(prompts[0]) > 32 > len(prompts[1])
        params = SamplingParams(max_tokens=6, temperature=TEMPERATURE, seed=5)

        async def first() -> list:
            return await asyncio.gather(*[p.sample(q, 2, params) for q in prompts])

        turn1 = asyncio.run(first())
        histories = []
        for prompt, group in zip(prompts, turn1, strict=True):
            for k, s in enumerate(group):
                obs = _prompt(p, " <information> doc" + " text" * (3 * k + len(histories)))
                history = prompt + list(s.tokens)
                histories.append((history, [False] * len(prompt) + [True] * len(s.tokens), obs))
        before = p.sampler.stats.reused_tokens

        async def second() -> list:
            return await asyncio.gather(*[p.sample(h + obs, 1, params) for h, _, obs in histories])

        turn2 = asyncio.run(second())
        if kv_cache.editable(_probe_cache(p)):
            assert p.sampler.stats.reused_tokens - before == sum(
                len(h) - 1 for h, _, _ in histories
            )
        datums = []
        flat1 = [s for g in turn1 for s in g]
        for (h, mask, obs), s1, (s2,) in zip(histories, flat1, turn2, strict=True):
            full = h + obs + list(s2.tokens)
            trained = mask + [False] * len(obs) + [True] * len(s2.tokens)
            logprobs = [0.0] * (len(h) - len(s1.tokens)) + list(s1.logprobs)
            logprobs += [0.0] * len(obs) + list(s2.logprobs)
            datums.append(
                Datum(
                    tuple(full[:-1]),
                    tuple(full[1:]),
                    tuple(logprobs[1:]),
                    tuple(1.0 if t else 0.0 for t in trained[1:]),
                    trajectory_id="t",
                )
            )
        out = forward_backward(p, datums, NamedLoss("importance_sampling", importance_sampling))
        assert out.metrics["mismatch/logprob_diff_max"] <= _tolerance(name), name
    finally:
        p.close()
