"""Sampling an FSDP2-sharded model in lockstep (``fsdp.Lockstep``, 2 gloo ranks under
torchrun, float64): the same tokens and log-probs as sampling it gathered whole, with the
same seeds, while no more than one decoder layer is ever whole at once; the ranks have
unequal work (one has none in a call) and all finish."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import assert_same64
from test_torchrun import TORCHRUN, _env

HERE = Path(__file__).parent


@pytest.mark.slow
def test_lockstep_sampling_equals_the_gathered_sampling_with_the_same_seeds(
    tmp_path: Path,
) -> None:
    model = build_small_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    worker = HERE / "lockstep_worker.py"
    subprocess.run(
        [*TORCHRUN, "2", worker, model, out], check=True, env=_env(tmp_path), timeout=300
    )
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for rank, got in enumerate(ranks):
        calls = sum(len(call) for call in got["gather"])
        assert calls == (1 if rank == 0 else 4), rank  # the worker's requests, all answered
        for gathered, stepped in zip(got["gather"], got["lockstep"], strict=True):
            for want_samples, got_samples in zip(gathered, stepped, strict=True):
                for want, sample in zip(want_samples, got_samples, strict=True):
                    assert sample.tokens == want.tokens and sample.tokens, rank
                    assert sample.stop_reason == want.stop_reason
                    assert_same64(
                        torch.tensor(sample.logprobs, dtype=torch.float64),
                        torch.tensor(want.logprobs, dtype=torch.float64),
                        f"rank {rank}",
                    )
        # gathered: every layer whole through the sampling; lockstep: one at a time
        assert got["gather_whole_layers"] == got["layers"] == 2
        assert got["lockstep_whole_layers"] == 1
        assert got["sharded_after"] and got["trains_after"]
    # rank 0 (less work, none in the second call) joined rank 1's forwards with idle ones
    assert ranks[0]["idle_forwards"] > 0
