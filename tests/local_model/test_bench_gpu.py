"""``bench/gpu.py --tiny``: the GPU check's code path (Qwen3-4B- and Qwen3.5-4B-shaped
configs from ``bench/configs/``, shrunk; Qwen3.5 saved as its composite checkpoint with a
vision tower and loaded text-only; multi-turn rollout with cache reuse; one training step;
the 2-rank update against one process's) runs on the CPU and prints one JSON line with its
figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_bench_tiny_runs_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--tiny"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout
    report = json.loads(lines[0])
    assert report["bench"] == "gpu" and report["tiny"] is True
    for name in ("qwen3-4b", "qwen3.5-4b"):
        figures = report[name]
        assert figures["sampled_tokens"] > 0 and figures["tokens_per_s"] > 0
        assert figures["prefill_ratio"] <= 1.1  # later turns continue their retained cache
        assert figures["logprob_diff_max"] <= 1e-4
        assert 0.999 <= figures["ratio_min"] <= figures["ratio_max"] <= 1.001
        assert figures["step_s"] > 0
        # The sampler's and the learner's peaks are reported apart.
        assert figures["sampler_peak_mib"] >= figures["sampler_start_mib"] > 0
        assert figures["learner_peak_mib"] >= figures["learner_start_mib"] > 0
    # Qwen3.5 goes through its published composite layout: the checkpoint holds a vision
    # tower, the provider's load takes the text stack alone, weight for weight.
    # The 2-rank check (gloo here, nccl on 2+ GPUs): the ranks' update is one process's.
    ranks = report["ranks"]
    assert ranks["backend"] == "gloo" and ranks["equal"], ranks
    layout = report["qwen3.5-4b"]
    assert layout["loaded_class"] == "Qwen3_5ForCausalLM" and layout["text_weights_equal"]
    assert layout["vision_checkpoint_mib"] > 0 and layout["vision_on_device_mib"] == 0
