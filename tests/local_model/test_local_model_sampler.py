"""Sampling of the local provider on the tiny model (CPU, float64 so that its log-probs can be
compared with the learner's to ``numerics.RTOL64`` on any CPU): batching, stops, log-probs."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import RTOL64
from trainer_calls import forward_backward

from searchr1.core.config_schema import Config
from searchr1.core.step_metrics import ratio_metrics
from searchr1.core.types import Datum, SamplingParams
from searchr1.kit.learner.learner import token_logprobs
from searchr1.plugins.local_model.next_token import sample_next
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

TEMPERATURE = 0.7
# A log-prob is at most ~20 in magnitude here (vocabulary 800 at temperature 0.7).
LOGPROB_TOL = 20 * RTOL64


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelProvider]:
    path = build_small_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab_size=800, max_position_embeddings=256
    )
    config = Config().replace(
        model={"base_model": str(path), "temperature": TEMPERATURE, "dtype": "float64"},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    p = LocalModelProvider.from_config(config)
    # LoRA B starts at zero; perturb it so the adapter path is exercised too.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    yield p
    p.close()


def _prompt(p: LocalModelProvider, text: str) -> list[int]:
    tok = p.tokenizer
    return tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    )


def _run(coro):  # noqa: ANN001, ANN202
    return asyncio.run(coro)


def test_concurrent_calls_share_one_batch(provider: LocalModelProvider) -> None:
    prompts = [
        _prompt(provider, "Who wrote the novel?"),
        _prompt(provider, "Where?"),
        _prompt(provider, "When did the king of the island die? " * 3),
    ]
    params = SamplingParams(max_tokens=6, temperature=1.0)
    before = provider.sampler.stats.batches

    async def many() -> list:
        return await asyncio.gather(
            *[provider.sample(p, n, params) for p in prompts for n in (1, 3)]
        )

    results = _run(many())
    assert provider.sampler.stats.batches == before + 1
    assert [len(r) for r in results] == [1, 3] * 3
    for group in results:
        for s in group:
            assert 1 <= len(s.tokens) <= 6 and len(s.logprobs) == len(s.tokens)
            assert s.stop_reason in ("stop", "length")


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampler_logprobs_match_learner(provider: LocalModelProvider, top_p: float) -> None:
    """The learner's log-prob of each sampled token (one position earlier) equals the
    sampler's, for prompts of different lengths sampled together (left padding)."""
    prompts = [
        _prompt(provider, "Who wrote it?"),
        _prompt(provider, "Which year was the bridge over the river built? " * 4),
    ]
    params = SamplingParams(max_tokens=24, temperature=TEMPERATURE, top_p=top_p, seed=3)

    async def both() -> list:
        return await asyncio.gather(*[provider.sample(p, 2, params) for p in prompts])

    results = _run(both())
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
    result = forward_backward(provider, datums, NamedLoss("is", importance_sampling))
    provider.learner.optimizer.zero_grad(set_to_none=True)
    assert result.metrics["mismatch/logprob_diff_max"] <= LOGPROB_TOL
    ratio_mean = ratio_metrics(result.metrics)["ratio_mean"]  # what the step logs
    assert ratio_mean == pytest.approx(1.0, abs=LOGPROB_TOL)
    assert result.metrics["tokens"] == sum(len(s.tokens) for g in results for s in g)


def test_greedy_returns_argmax_and_untempered_logprobs(provider: LocalModelProvider) -> None:
    prompt = _prompt(provider, "Who is the author?")
    (s,) = _run(provider.sample(prompt, 1, SamplingParams(max_tokens=8, temperature=0.0)))
    full = torch.tensor([prompt + list(s.tokens)])
    with torch.no_grad():
        logits = provider.model(input_ids=full).logits[0, len(prompt) - 1 : -1]
        lp = token_logprobs(
            provider.model, full[:, :-1], torch.ones_like(full[:, :-1]), full[:, 1:], 1.0
        )[0, len(prompt) - 1 :]
    assert list(s.tokens) == logits.argmax(-1).tolist()
    assert max(abs(a - b) for a, b in zip(s.logprobs, lp.tolist(), strict=True)) <= LOGPROB_TOL


def test_stop_string_ends_at_the_completing_token(provider: LocalModelProvider) -> None:
    prompt = _prompt(provider, "Tell me about the river.")
    tok = provider.tokenizer
    greedy = SamplingParams(max_tokens=30, temperature=0.0)
    (full,) = _run(provider.sample(prompt, 1, greedy))
    text = tok.decode(full.tokens)
    # A stop string that the greedy continuation completes mid-way (spanning tokens 3..5).
    stop = tok.decode(full.tokens[3:6])[1:]
    assert stop and stop in text
    first = next(k for k in range(1, len(full.tokens) + 1) if stop in tok.decode(full.tokens[:k]))
    (stopped,) = _run(
        provider.sample(
            prompt,
            1,
            SamplingParams(max_tokens=30, temperature=0.0, stop_strings=("</answer>", stop)),
        )
    )
    assert stopped.stop_reason == "stop"
    assert stopped.tokens == full.tokens[:first]
    assert stopped.logprobs == pytest.approx(full.logprobs[:first], abs=LOGPROB_TOL)
    assert tok.decode(stopped.tokens).endswith(stop) or stop in tok.decode(stopped.tokens[-1:])


def test_stop_token_ids_and_length(provider: LocalModelProvider) -> None:
    prompt = _prompt(provider, "Name a city.")
    (full,) = _run(provider.sample(prompt, 1, SamplingParams(max_tokens=12, temperature=0.0)))
    assert full.stop_reason == "length" and len(full.tokens) == 12
    stop_id = full.tokens[4]
    first = full.tokens.index(stop_id)
    (s,) = _run(
        provider.sample(
            prompt, 1, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_id,))
        )
    )
    assert s.stop_reason == "stop" and s.tokens == full.tokens[: first + 1]


def test_eos_always_stops(provider: LocalModelProvider) -> None:
    """A sequence never runs past eos even when the caller lists no stop ids."""
    eos = provider.tokenizer.eos_token_id
    prompt = _prompt(provider, "Hi")
    results = _run(provider.sample(prompt, 32, SamplingParams(max_tokens=20, temperature=3.0)))
    for s in results:
        assert eos not in s.tokens[:-1]
        if s.tokens[-1] == eos:
            assert s.stop_reason == "stop"


def test_seed_reproduces_whatever_shares_the_batch(provider: LocalModelProvider) -> None:
    prompt = _prompt(provider, "Where was the painter born?")
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=11)
    alone = _run(provider.sample(prompt, 2, params))

    async def crowded() -> list:
        other = SamplingParams(max_tokens=20, temperature=1.0)
        results = await asyncio.gather(
            provider.sample(_prompt(provider, "A much longer question " * 6), 3, other),
            provider.sample(prompt, 2, params),
        )
        return results[1]

    again = _run(crowded())
    assert [s.tokens for s in again] == [s.tokens for s in alone]
    for a, b in zip(alone, again, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
    assert alone[0].tokens != alone[1].tokens  # the two samples use different streams


def test_bad_requests_raise_naming_the_field(provider: LocalModelProvider) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        _run(provider.sample([1, 2], 1, SamplingParams(max_tokens=0)))
    with pytest.raises(ValueError, match="top_p"):
        _run(provider.sample([1, 2], 1, SamplingParams(max_tokens=2, top_p=0.0)))
    with pytest.raises(ValueError, match="stop_strings"):
        _run(provider.sample([1, 2], 1, SamplingParams(max_tokens=2, stop_strings=("",))))
    with pytest.raises(ValueError, match="vocabulary"):
        _run(provider.sample([1, 10**6], 1, SamplingParams(max_tokens=2)))
    with pytest.raises(ValueError, match="context"):
        _run(provider.sample([1] * 300, 1, SamplingParams(max_tokens=2)))


def test_generation_is_capped_by_the_context(provider: LocalModelProvider) -> None:
    (s,) = _run(provider.sample([5] * 250, 1, SamplingParams(max_tokens=50, temperature=0.0)))
    assert len(s.tokens) <= 6


# ---------------------------------------------------------------- sample_next on fixed logits

PROBS = [0.5, 0.3, 0.1, 0.06, 0.04]


def _draw(u: float, top_p: float, temperature: float = 1.0) -> tuple[int, float]:
    logits = torch.tensor([[math.log(p) for p in PROBS]], dtype=torch.float64)
    tok, lp = sample_next(
        logits, torch.tensor([temperature]), torch.tensor([top_p]), torch.tensor([u])
    )
    return int(tok[0]), float(lp[0])


def test_top_p_keeps_the_nucleus_and_reports_pre_truncation_logprob() -> None:
    # top_p = 0.75: tokens 0 and 1 (mass before token 2 is 0.8 >= 0.75); renormalised
    # CDF [0.625, 1.0]
    assert _draw(0.60, 0.75) == (0, pytest.approx(math.log(0.5), abs=RTOL64))
    assert _draw(0.65, 0.75) == (1, pytest.approx(math.log(0.3), abs=RTOL64))
    assert {_draw(u / 100, 0.75)[0] for u in range(100)} == {0, 1}
    # top_p = 1: plain inverse CDF over all five tokens
    assert _draw(0.97, 1.0)[0] == 4


def test_temperature_scales_logprobs() -> None:
    tok, lp = _draw(0.0, 1.0, temperature=0.5)
    expected = 2 * math.log(0.5) - math.log(sum(p**2 for p in PROBS))
    assert tok == 0 and lp == pytest.approx(expected, abs=RTOL64)
    tok, lp = _draw(0.99, 1.0, temperature=0.0)  # greedy ignores the draw
    assert tok == 0 and lp == pytest.approx(math.log(0.5), abs=RTOL64)


def test_requests_joining_a_running_batch_sample_as_if_alone(
    provider: LocalModelProvider,
) -> None:
    """Requests admitted between decoding steps (with longer and shorter prompts than the
    running batch) get the same tokens and log-probs as when sampled alone."""
    from searchr1.plugins.local_model.generation import Job

    sampler = provider.sampler
    specs = [
        (_prompt(provider, "Who wrote it?"), 2, SamplingParams(max_tokens=12, seed=5)),
        (
            _prompt(provider, "Where was the painter of the old town born? " * 3),
            1,
            SamplingParams(max_tokens=20, temperature=0.7, seed=9, stop_strings=("</answer>",)),
        ),
        ([7, 8, 9], 2, SamplingParams(max_tokens=8, temperature=0.0)),
    ]
    alone = [sampler.generate([spec])[0] for spec in specs]
    jobs = [Job(list(p), n, params) for p, n, params in specs]
    calls = 0

    def admit(capacity: int) -> list:
        nonlocal calls
        calls += 1
        return {3: [jobs[1]], 6: [jobs[2]]}.get(calls, [])

    before = sampler.stats.admitted_requests
    with torch.inference_mode():
        sampler._run([jobs[0]], admit=admit)
    assert sampler.stats.admitted_requests == before + 2
    for job, expected in zip(jobs, alone, strict=True):
        assert [s.tokens for s in job.results] == [s.tokens for s in expected]
        for got, want in zip(job.results, expected, strict=True):
            assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOL)
            assert got.stop_reason == want.stop_reason


def test_a_request_is_answered_when_its_rows_stop(provider: LocalModelProvider) -> None:
    """A short request does not wait for the longest row of its batch."""
    stats = provider.sampler.stats

    async def two() -> tuple[int, int]:
        long = asyncio.ensure_future(
            provider.sample([5, 6, 7], 1, SamplingParams(max_tokens=200, temperature=0.0))
        )
        await provider.sample([5, 6, 7, 8], 1, SamplingParams(max_tokens=2, temperature=0.0))
        at_short = stats.forward_calls
        await long
        return at_short, stats.forward_calls

    start = stats.forward_calls
    at_short, at_end = _run(two())
    assert at_short - start < 100 < at_end - start
