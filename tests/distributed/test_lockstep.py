"""Sampling an FSDP2-sharded model in lockstep (``fsdp.Lockstep``, 2 gloo ranks under
torchrun, float64): called directly, the same tokens and log-probs as sampling it gathered
whole, with the same seeds, while no more than one decoder layer is ever whole at once; the
ranks have unequal work (one has none in a call) and all finish. Through ``searchr1 train``
(``[model.local] fsdp_sampling = "lockstep"``): the same trajectories, update and checkpoint
as the gathered rollout, and it resumes; without ``fsdp`` the setting is refused."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import torch
from cli_run import Result, make_config, write_config
from fakes import build_small_tiny_model
from numerics import assert_same64
from safetensors.torch import load_file
from test_torchrun import RUN, TORCHRUN, _env, _events, _train

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


def _rank_events(run_dir: Path, event: str) -> list[dict]:
    """Every rank's ``event`` events (rank 0's in events.jsonl, the others' in ranks/)."""
    lines = (run_dir / "ranks" / "rank1.jsonl").read_text().splitlines()
    return _events(run_dir, event) + [e for e in map(json.loads, lines) if e["event"] == event]


@pytest.mark.slow
def test_lockstep_rollout_trains_as_the_gathered_rollout_and_resumes(tmp_path: Path) -> None:
    """``searchr1 train --nproc 2``, fsdp = true, float64, the offline world (searches
    between turns: the ranks wait on search at different times): with fsdp_sampling =
    "lockstep" each step's trajectories (tokens, log-probs, rewards), metrics and the
    checkpointed adapter are those of the gathered rollout with the same seed, and so are
    rank 0's held-out evals (rank 1 joins their forwards)."""
    runs = {}
    for mode in ("gather", "lockstep"):
        local = {"fsdp": True, "fsdp_sampling": mode}
        text = make_config(
            RUN,
            model={"dtype": "float64", "local": local},
            # rank 0's held-out eval after each step: it alone samples, the others join
            train={"eval_every": 1, "eval_questions": 2},
            data={"eval": "builtin:world/heldout.jsonl"},
        )
        config = write_config(tmp_path / mode, text)
        run_dir = runs[mode] = tmp_path / mode / "run"
        done = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        sharded = _rank_events(run_dir, "fsdp_sharded")
        assert [e["sampling"] for e in sharded] == [mode, mode]
    gather, lockstep = runs["gather"], runs["lockstep"]
    metrics = _events(lockstep, "metrics")
    assert [(m["step"], m["world_size"]) for m in metrics] == [(1, 2), (2, 2)]
    for want, got in zip(_events(gather, "metrics"), metrics, strict=True):
        keys = ("loss", "optim/grad_norm", "reward/mean", "health/response_tokens")
        for key in (*keys, "eval/heldout_format_rate", "eval/heldout_search_calls_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    searched = 0
    for step in (1, 2):
        name = f"trajectories/step_{step:06d}.jsonl"
        want = [json.loads(line) for line in (gather / name).read_text().splitlines()]
        got = [json.loads(line) for line in (lockstep / name).read_text().splitlines()]
        assert len(got) == 6
        for a, b in zip(want, got, strict=True):
            assert b["trajectory_id"] == a["trajectory_id"]
            assert b["turns"] == a["turns"] and b["reward"] == a["reward"]
            assert b["num_generated_tokens"] == a["num_generated_tokens"]
        searched += sum(t["search_calls"] for t in got)
    assert searched > 0  # some trajectories searched between their turns
    adapter = "checkpoints/step_000002/model/adapter/adapter_model.safetensors"
    want_w, got_w = load_file(gather / adapter), load_file(lockstep / adapter)
    assert want_w.keys() == got_w.keys()
    for name in want_w:  # rank 0 saved the whole adapter, gathered after the last step
        assert_same64(got_w[name], want_w[name], name)
    assert any(float(t.abs().max()) > 0 for k, t in got_w.items() if "lora_B" in k)
    # resume: every rank loads its shards outside a sampling session, then samples again
    config = tmp_path / "lockstep" / "config.toml"
    resume = ("--config", config, "--run-dir", lockstep, "--resume", "--max-steps", 3)
    resumed = _train(tmp_path, *resume, nproc=2)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [m["step"] for m in _events(lockstep, "metrics")] == [1, 2, 3]


@pytest.mark.slow
def test_a_rank_that_fails_alone_ends_the_lockstep_job_promptly(tmp_path: Path) -> None:
    """Rank 0's first checkpoint fails (a file stands where it goes) while rank 1, its sampling
    session open, waits for it at the step's end: rank 0 leaves its session alone and the job
    ends in seconds, as with the gathered rollout (not after the sampler's minute-long waits)."""
    local = {"fsdp": True, "fsdp_sampling": "lockstep"}
    text = make_config(RUN, model={"local": local}, train={"max_steps": 3, "save_every": 1})
    config = write_config(tmp_path, text)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000001").write_text("not a folder")
    done = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2)
    ended = time.time()
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 2 and "step_000001 is a file" in done.stderr, said
    (step,) = _events(run_dir, "metrics")  # step 1 learned; its save failed on rank 0
    took = ended - datetime.fromisoformat(step["timestamp"]).timestamp()
    assert took < 45, f"the job took {took:.0f} s to end after the failure\n{said}"


def test_lockstep_sampling_without_fsdp_is_refused_naming_both_settings(
    run_cli: Callable[..., Result], config_file: Callable[..., Path]
) -> None:
    path = config_file(make_config(model={"local": {"fsdp_sampling": "lockstep"}}))
    result = run_cli("config", "check", "--config", path)
    assert result.code == 2
    assert 'model.local.fsdp_sampling = "lockstep"' in result.err
    assert "model.local.fsdp = true" in result.err
    assert f"{path.name}:" in result.err  # where: the file and line
