"""Data and one training step shared by the remote provider tests (PyTRIO and tinker) and
``bench/remote_step.py``."""

from __future__ import annotations

import dataclasses
import random

from trainer_calls import forward_backward, optim_step

from searchr1.core.config_schema import Config
from searchr1.core.plugins import load_registry
from searchr1.core.types import AdamParams, Datum
from searchr1.plugins.losses import NamedLoss, importance_sampling

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IS_LOSS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=2e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)


def make_datums(vocab: int, seed: int = 1, n: int = 4) -> list[Datum]:
    """Random sequences; the last half of each is 'generated' (advantage +-1, sampler lp)."""
    rng = random.Random(seed)
    datums = []
    for i in range(n):
        length = rng.randint(10, 24)
        tokens = [rng.randrange(vocab) for _ in range(length + 1)]
        gen_from = length // 2
        adv = 1.0 if i % 2 == 0 else -1.0
        datums.append(
            Datum(
                input_tokens=tuple(tokens[:-1]),
                target_tokens=tuple(tokens[1:]),
                sampler_logprobs=tuple(
                    0.0 if j < gen_from else -6.5 + 0.1 * rng.random() for j in range(length)
                ),
                advantages=tuple(0.0 if j < gen_from else adv for j in range(length)),
                trajectory_id=f"t{i}",
            )
        )
    return datums


def one_step(provider, datums, loss_fn=IS_LOSS) -> tuple[float, float, float]:
    """Two micro-batches (loss_scale n_k/N), one optimizer step, then the loss after it."""
    half = len(datums) // 2
    first = forward_backward(provider, datums[:half], loss_fn, half / len(datums))
    second = forward_backward(provider, datums[half:], loss_fn, (len(datums) - half) / len(datums))
    metrics = optim_step(provider, ADAM)
    after = forward_backward(provider, datums, loss_fn, 1.0)
    return first.loss + second.loss, metrics["grad_norm"], after.loss


def waits(requests: list[tuple[str, str, float, float]], path: str, since: float) -> list:
    """The (start, end) of every request to ``path`` (a result wait) started after ``since``,
    from a fake service's request log."""
    return sorted((s, e) for _, p, s, e in requests if p.startswith(path) and s >= since)


def max_in_flight(intervals: list) -> int:
    """The most intervals open at the same moment."""
    edges = [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals]
    open_now = peak = 0
    for _, delta in sorted(edges):  # an end (-1) sorts before a start at a tie
        open_now += delta
        peak = max(peak, open_now)
    return peak


def round_trips(intervals: list) -> int:
    """How many waits happened one after another: overlapping waits count as one round trip."""
    rounds, end = 0, float("-inf")
    for s, e in sorted(intervals):
        if s >= end:
            rounds += 1
        end = max(end, e) if s < end else e
    return rounds


def check_pin_holds_until_the_next_pin(provider) -> None:
    """Pipelined steps: after ``snapshot_sampler()`` a rollout samples the pinned weights even
    when ``optim_step`` meanwhile points sampling at new ones; the next pin follows them."""
    import asyncio

    from searchr1.core.types import SamplingParams

    prompt = provider.tokenizer.encode("Question: who wrote the novel?")
    params = SamplingParams(max_tokens=4, seed=3)
    before = asyncio.run(provider.sample(prompt, 1, params))[0]
    asyncio.run(provider.snapshot_sampler())
    forward_backward(provider, make_datums(len(provider.tokenizer)), IS_LOSS)
    optim_step(provider, AdamParams(learning_rate=0.5))
    assert asyncio.run(provider.sample(prompt, 1, params))[0].logprobs == before.logprobs
    asyncio.run(provider.snapshot_sampler())
    assert asyncio.run(provider.sample(prompt, 1, params))[0].logprobs != before.logprobs


def remote_config(provider: str, base_url: str, api_key: str, table: dict[str, object]) -> Config:
    """A remote provider's config against a fake service: the tiny random model's tokenizer,
    a rank-8 LoRA over every projection, and ``[model.<provider>]`` = ``table``."""
    config = Config(assets=load_registry().assets).replace(
        model={
            "provider": provider,
            "api_base": base_url,
            "api_key": api_key,
            "base_model": "builtin:tiny-random",
            "temperature": 1.0,
            "device": "cpu",
            "dtype": "float32",
        },
        lora={"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": TARGETS},
        run={"seed": 0},
    )
    return dataclasses.replace(config, plugins={f"model.{provider}": dict(table)})
