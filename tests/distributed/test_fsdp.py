"""``[model.local] fsdp = true`` under torchrun (2 processes, gloo on CPU, the tiny model):
the sharded update equals one unsharded process's on fixed datums, ranks with unequal work
(micro-batches, samples) finish, the checkpoint rank 0 writes is whole and loadable by peft,
and ``searchr1 train --nproc 2`` records once per step and resumes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from cli_run import make_config, write_config
from fakes import build_small_tiny_model
from numerics import assert_same64
from test_torchrun import RUN, TORCHRUN, _env, _events, _train

HERE = Path(__file__).parent


@pytest.mark.slow
def test_fsdp_update_of_two_ranks_equals_the_unsharded_one_process_update(
    tmp_path: Path,
) -> None:
    """Float64, a KL term toward a pinned reference, gradient checkpointing, one micro-batch
    per datum (rank 0 runs 2 in step 1 and 1 in step 2, rank 1 runs 3 and none), sampling
    between the steps (rank 1 twice as often): the same LoRA weights as one process without
    FSDP after two AdamW steps, and the checkpoint holds them whole."""
    import update_worker  # this folder's; one process: here, without torchrun
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = build_small_tiny_model(tmp_path / "tiny")
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    update_worker.main(str(model), str(one), "kl")
    worker = HERE / "update_worker.py"
    subprocess.run(
        [*TORCHRUN, "2", worker, model, two, "fsdp"], check=True, env=_env(tmp_path), timeout=300
    )
    a, b = torch.load(one), torch.load(two)
    assert a.keys() == b.keys() and a
    for name in a:
        assert_same64(b[name], a[name], name)
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # it learned
    # rank 0's checkpoint: the whole adapter, as peft loads it, and the whole AdamW moments
    state = Path(f"{two}.state")
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64)
    loaded = PeftModel.from_pretrained(base, state / "adapter")
    named = dict(loaded.named_parameters())
    del a["grad_norm"]
    for name in a:
        assert_same64(named[name].detach(), a[name], name)
    moments = torch.load(state / "optimizer.pt")["state"]
    assert len(moments) == len(a)
    assert all(
        m["exp_avg"].shape == t.shape for m, t in zip(moments.values(), a.values(), strict=True)
    )


@pytest.mark.slow
def test_fsdp_train_through_the_cli_records_once_and_resumes(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, make_config(RUN, model={"local": {"fsdp": True}}))
    run_dir = tmp_path / "run"
    done = _train(tmp_path, "--config", config, "--run-dir", run_dir, nproc=2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = _events(run_dir, "metrics")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["world_size"] == 2 for m in metrics)
    for m in metrics:  # every rank's trajectories, gathered: 2 questions x 3 each
        dumped = run_dir / "trajectories" / f"step_{m['step']:06d}.jsonl"
        assert len(dumped.read_text().splitlines()) == 6
    sharded = _events(run_dir, "fsdp_sharded") + [
        e
        for e in map(json.loads, (run_dir / "ranks" / "rank1.jsonl").read_text().splitlines())
        if e["event"] == "fsdp_sharded"
    ]
    assert len(sharded) == 2  # both ranks sharded the model
    adapter = run_dir / "checkpoints" / "step_000002" / "model" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    # resume in an FSDP job: every rank reads the whole files (the format a one-process run
    # writes too: the first test loads them with peft) and keeps its shard
    resume = ("--config", config, "--run-dir", run_dir, "--resume", "--max-steps", 3)
    resumed = _train(tmp_path, *resume, nproc=2)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [m["step"] for m in _events(run_dir, "metrics")] == [1, 2, 3]
    assert [c["step"] for c in _events(run_dir, "checkpoint")] == [2, 3]
