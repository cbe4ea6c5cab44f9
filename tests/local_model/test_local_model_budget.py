"""Bounded sampler memory: a token budget on the cache, no padding to one long row's width,
chunked prefill; gradient checkpointing on by default with CUDA only."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from numerics import LOGPROB_TOL_F32
from trainer_calls import forward_backward

from searchr1.core.config_schema import Config
from searchr1.core.types import Datum, SamplingParams
from searchr1.kit.learner.budget import budget_source, kv_bytes_per_token, token_budget
from searchr1.kit.learner.loading import checkpointing_on
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling
from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tiny_model

BUDGET = 3000  # cache positions (rows x width)
LONG = 900  # tokens of the one long trajectory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny"),
        BUILTIN_TEXT,
        vocab_size=600,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,
    )


def _provider(model_dir: Path, **local: object) -> LocalModelProvider:
    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": 1.0},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0},
    )
    config = dataclasses.replace(config, plugins={"model.local": {"batch_wait_ms": 20.0, **local}})
    return LocalModelProvider.from_config(config)


@pytest.fixture()
def bounded(model_dir: Path) -> Iterator[LocalModelProvider]:
    p = _provider(model_dir, max_batch_tokens=BUDGET, prefill_chunk_tokens=128)
    p.sampler.measure_bytes = True
    yield p
    p.close()


def _workload(p: LocalModelProvider) -> list[tuple[list[int], SamplingParams]]:
    tok = p.tokenizer
    long = (tok.encode(" ".join(BUILTIN_TEXT)) * 50)[:LONG]
    short = [tok.encode(f"Question {i}: who wrote the book?") for i in range(15)]
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=i) for i in range(16)]
    return list(zip([long, *short], params, strict=True))


def test_one_long_trajectory_keeps_the_batch_under_the_token_budget(
    bounded: LocalModelProvider,
) -> None:
    work = _workload(bounded)

    async def all_at_once() -> list:
        return await asyncio.gather(*[bounded.sample(p, 1, params) for p, params in work])

    results = asyncio.run(all_at_once())
    stats = bounded.sampler.stats
    # Measured: the bytes the cache tensors held, at their largest, fit the budget, while
    # padding all 16 rows to the long row's width would need 16 x 908 positions.
    per_token = kv_bytes_per_token(bounded.model.config, torch.float32)
    assert len(work) * (LONG + 8) > 4 * BUDGET
    assert 0 < stats.peak_cache_bytes <= BUDGET * per_token
    assert stats.peak_cache_tokens <= BUDGET
    assert stats.peak_cache_bytes >= (LONG + 1) * per_token  # the long row was measured too
    # Chunked prefill: the 900-token prompt took several forwards of <= 128 columns.
    assert stats.forward_calls > 16 + 900 // 128

    # Each request samples what it samples alone, and the learner agrees with the
    # sampler on the long row prefilled in chunks.
    (alone,) = asyncio.run(bounded.sample(work[3][0], 1, work[3][1]))
    assert results[3][0].tokens == alone.tokens
    prompt, (s,) = work[0][0], results[0]
    full = prompt + list(s.tokens)
    pad = len(prompt) - 1
    datum = Datum(
        tuple(full[:-1]),
        tuple(full[1:]),
        (0.0,) * pad + s.logprobs,
        (0.0,) * pad + (1.0,) * len(s.tokens),
        trajectory_id="long",
    )
    out = forward_backward(bounded, [datum], NamedLoss("is", importance_sampling))
    assert out.metrics["mismatch/logprob_diff_max"] <= LOGPROB_TOL_F32  # a float32 model


def test_budget_defaults() -> None:
    """A set budget is used as is; 0 derives one from memory (RAM on the CPU); gradient
    checkpointing is on by default only with CUDA."""
    from transformers import Qwen3Config

    config = Qwen3Config(num_hidden_layers=36, num_key_value_heads=8, head_dim=128)
    # Qwen3-4B: 36 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 144 KiB per token.
    assert kv_bytes_per_token(config, torch.bfloat16) == 144 * 1024
    assert token_budget(5000, config, torch.bfloat16, torch.device("cpu")) == 5000
    assert token_budget(0, config, torch.bfloat16, torch.device("cpu")) >= 1024
    # on the CPU from the machine's total RAM, not what is free now: the budget decides which
    # requests may share a batch, so two runs on one machine must get the same
    meminfo = Path("/proc/meminfo").read_text()
    total = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)[1]) * 1024
    assert token_budget(0, config, torch.bfloat16, torch.device("cpu")) == max(
        1024, total // 4 // (144 * 1024)
    )
    assert "the same on every run" in budget_source(0, torch.device("cpu"))
    assert "set [model.local] max_batch_tokens" in budget_source(0, torch.device("cuda"))
    assert checkpointing_on("auto", torch.device("cuda")) is True
    assert checkpointing_on("auto", torch.device("cpu")) is False
    assert checkpointing_on(True, torch.device("cpu")) is True


def test_rows_beyond_the_budget_wait_for_the_next_batch(bounded: LocalModelProvider) -> None:
    """Twelve equal 300-token prompts (no padding at all) would hold 12 x 308 positions;
    under a 3000-token budget at most 9 run at once; the others join as rows finish."""
    tok = bounded.tokenizer
    base = tok.encode(" ".join(BUILTIN_TEXT)) * 20
    prompts = [base[i * 7 : i * 7 + 300] for i in range(12)]
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=1)
    stats = bounded.sampler.stats

    async def all_at_once() -> list:
        return await asyncio.gather(*[bounded.sample(p, 1, params) for p in prompts])

    results = asyncio.run(all_at_once())
    assert len(results) == 12
    assert 12 * 308 > BUDGET
    assert stats.max_batch_rows == BUDGET // 308
    per_token = kv_bytes_per_token(bounded.model.config, torch.float32)
    assert stats.peak_cache_bytes <= BUDGET * per_token


def test_recurrent_state_counts_per_row() -> None:
    """Qwen3.5-4B's shape: 24 Gated DeltaNet layers hold ~50 MiB of state per row, which the
    budget charges as token-equivalents of its 8 attention layers' KV."""
    from searchr1.kit.learner.budget import row_overhead_tokens, state_bytes_per_row

    root = Path(__file__).resolve().parents[2]
    import json

    from transformers import AutoConfig

    data = json.loads((root / "bench" / "configs" / "qwen3.5-4b.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_") and k != "architectures"}
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    # 8 attention layers x 4 KV heads x 256 x 2 (K, V) x 2 bytes = 32 KiB per token.
    assert kv_bytes_per_token(config, torch.bfloat16) == 32 * 1024
    # 24 layers x (32 x 128 x 128 x 4 bytes recurrent + (2 x 16 x 128 + 32 x 128) x 4 x 2 conv)
    assert state_bytes_per_row(config, torch.bfloat16) == 24 * (2 * 1024 * 1024 + 65536)
    assert row_overhead_tokens(config, torch.bfloat16) == -(
        -(24 * (2 * 1024 * 1024 + 65536)) // 32768
    )
    from transformers import Qwen3Config

    assert state_bytes_per_row(Qwen3Config(), torch.bfloat16) == 0
