"""The ``vllm`` provider's composition without vLLM: the local learner trains, and every
weight change reaches the server as a new LoRA adapter the samples are then drawn from.

A loopback HTTP server (``tests/helpers/fake_vllm.py``) speaks the part of vLLM's API the
provider uses (``/health``, ``/v1/models``, adapter load/unload, ``/v1/completions``) and
records each call; it checks that a loaded adapter folder holds a peft adapter and that a
completion names a loaded one. Several servers: ``tests/remote/test_vllm_servers.py``.
Whether vLLM's samples match the learner is checked against a real server in
``tests/remote/test_vllm_provider.py`` (slow, needs the vLLM environment)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import SAMPLED, FakeVllm, connected, fake_vllm_servers, train_on

from searchr1.core.config_schema import Config
from searchr1.core.plugins import load_registry
from searchr1.core.types import SamplingParams

PROMPT = [1, 2, 3, 4]


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    with fake_vllm_servers(1) as (server,):
        yield server


async def _step(provider: Any) -> dict[str, float]:
    return await train_on(provider, PROMPT, list(SAMPLED))


async def _sample(provider: Any) -> list[Any]:
    return await provider.sample(PROMPT, 2, SamplingParams(max_tokens=8))


def test_each_update_reaches_the_server_as_a_new_adapter(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    config = Config(
        plugins={"model.vllm": {"adapters_dir": str(tmp_path / "a")}}, assets=load_registry().assets
    ).replace(
        model={"provider": "vllm", "base_model": "builtin:tiny-random", "api_base": fake_vllm.url},
        lora={"rank": 8, "alpha": 16, "dropout": 0.0},
    )

    async def scenario() -> None:  # one event loop, as a command runs
        async with connected(config) as provider:
            first = provider.adapter.name
            assert list(fake_vllm.loaded) == [first]  # version 0: the untrained adapter
            samples = await _sample(provider)
            assert [s.tokens for s in samples] == [tuple(SAMPLED)] * 2
            assert [c.model for c in fake_vllm.completions] == [first]
            with pytest.raises(
                ValueError, match=r"server's context \(model.vllm.max_model_len\) is 64"
            ):
                await provider.sample([1] * 64, 1, SamplingParams(max_tokens=8))

            metrics = await _step(provider)
            assert metrics["adapter_sync_s"] > 0 and provider.learner.step == 1
            second = provider.adapter.name
            assert list(fake_vllm.loaded) == [second]  # the old one unloaded, its folder gone
            assert not (tmp_path / "a" / first).exists()
            await _sample(provider)
            assert fake_vllm.completions[-1].model == second

            # Pipelined steps: the pinned adapter serves until the next pin.
            await provider.snapshot_sampler()
            await _step(provider)
            third = provider.adapter.name
            assert set(fake_vllm.loaded) == {second, third}
            await _sample(provider)
            assert fake_vllm.completions[-1].model == second
            await provider.snapshot_sampler()
            assert list(fake_vllm.loaded) == [third]
            await _sample(provider)
            assert fake_vllm.completions[-1].model == third

            # A checkpoint holds the learner's state; loading it publishes those weights
            # before the next sample.
            provider.save_state(str(tmp_path / "ckpt"))
            state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
            assert state["step"] == 2
            await _step(provider)
            await provider.load_state(str(tmp_path / "ckpt"))
            assert provider.learner.step == 2 and provider.pinned is None
            await _sample(provider)
            assert fake_vllm.completions[-1].model == provider.adapter.name

    asyncio.run(scenario())
    assert fake_vllm.loaded == {}  # a server that outlives the run keeps none of its adapters
    assert list((tmp_path / "a").iterdir()) == []
