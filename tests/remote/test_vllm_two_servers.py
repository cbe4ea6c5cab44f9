"""Two real vLLM-CPU servers kept on the trained adapter (slow; needs the vLLM environment).

The module fixture's provider launches both (``[model.vllm] servers = 2``): groups spread over
them, each server's samples match the learner before and after an update (a server left on
the old adapter would be off by the update's size, far above ``MAX_DIFF``), and each one's
mismatch is reported as ``mismatch/server<k>/*``. Then ``searchr1 train`` reaches the same two
servers through ``api_bases``, as it would reach two compose services. The fault paths (a
server that refuses, drops or answers without the adapter) are in
``tests/remote/test_vllm_servers.py`` against loopback fakes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from cli_run import read_events
from vllm_env import (
    MAX_DIFF,
    TEMPERATURE,
    chat_prompts,
    learner_diffs,
    offline_config,
    require_vllm,
    vllm_config,
)

from searchr1.cli.main import main as cli

pytestmark = pytest.mark.slow
require_vllm()


@pytest.fixture(scope="module")
def provider() -> Any:
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    p = VllmModelProvider.from_config(vllm_config(servers=2))
    servers = list(p.servers)
    assert len(servers) == 2
    yield p
    p.close()
    for server in servers:
        assert server.exited() is not None, "close() left a vLLM server running"
        with pytest.raises(ProcessLookupError):
            os.killpg(server.process.pid, 0)


def _served(provider: Any) -> list[set[str]]:
    return [{m["id"] for m in c.models() if m.get("parent")} for c in provider.clients]


def test_both_servers_sample_the_trained_adapter(provider: Any) -> None:
    from searchr1.core.types import AdamParams, Datum, SamplingParams
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    prompts = chat_prompts(provider, 4)

    async def rollout() -> list[Any]:
        return await asyncio.gather(
            *(
                provider.sample(
                    p,
                    4,
                    SamplingParams(
                        max_tokens=24, temperature=TEMPERATURE, seed=11 + g, group_id=f"g{g}"
                    ),
                )
                for g, p in enumerate(prompts)
            )
        )

    first = provider.adapter.name
    assert _served(provider) == [{first}, {first}]
    before = asyncio.run(rollout())
    assert sorted(provider.server_of(f"g{g}") for g in range(4)) == [0, 0, 1, 1]
    assert float(learner_diffs(provider, prompts, before).abs().max()) < MAX_DIFF

    datums = [
        Datum(
            tuple((p + list(s.tokens))[:-1]),
            tuple((p + list(s.tokens))[1:]),
            tuple([0.0] * (len(p) - 1) + list(s.logprobs)),
            tuple([0.0] * (len(p) - 1) + [1.0 if k % 2 else -1.0] * len(s.tokens)),
            trajectory_id=f"g{g}/{k}",
        )
        for g, (p, group) in enumerate(zip(prompts, before, strict=True))
        for k, s in enumerate(group)
    ]
    result = provider.forward_backward(
        datums, NamedLoss("importance_sampling", importance_sampling), 1 / 16
    )
    m = result.metrics
    for k in (0, 1):
        assert m[f"mismatch/server{k}/tokens"] > 0
        assert m[f"mismatch/server{k}/logprob_diff_max"] < MAX_DIFF
    assert m["mismatch/server0/tokens"] + m["mismatch/server1/tokens"] == m["mismatch/tokens"]

    provider.optim_step(AdamParams(learning_rate=2e-3))
    second = provider.adapter.name
    assert _served(provider) == [{second}, {second}]  # on both, the old one gone from both
    after = asyncio.run(rollout())
    assert after != before
    # Both servers sample the new weights: the learner (now updated) agrees with each.
    assert float(learner_diffs(provider, prompts, after).abs().max()) < MAX_DIFF


def test_train_on_two_running_servers_logs_each_servers_mismatch(
    provider: Any, tmp_path: Path
) -> None:
    bases = [c.api_base for c in provider.clients]
    config = offline_config(tmp_path, bases)
    run_dir = tmp_path / "runs" / "two-servers"
    args = ["train", "--config", str(config), "--run-dir", str(run_dir), "--max-steps", "2"]
    assert cli(args) == 0
    steps = read_events(run_dir, "metrics")
    assert [m["step"] for m in steps] == [1, 2]
    trained = [m for m in steps if m["tokens/trained"] > 0]
    assert trained
    for m in trained:
        per_server = [m.get(f"mismatch/server{k}/tokens", 0.0) for k in (0, 1)]
        assert sum(per_server) == m["mismatch/tokens"] == m["tokens/trained"]
        for k in (0, 1):
            if per_server[k]:
                assert m[f"mismatch/server{k}/logprob_diff_max"] < MAX_DIFF
    # Four groups a step over two servers: each served some of the run's trained tokens.
    assert all(sum(m.get(f"mismatch/server{k}/tokens", 0.0) for m in trained) > 0 for k in (0, 1))
    assert _served(provider) == [{provider.adapter.name}] * 2  # the run unloaded its own
    assert not list((tmp_path / "adapters").iterdir())
