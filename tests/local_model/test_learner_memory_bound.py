"""The chunked log-probs bound the learner's memory: ``bench/learner_memory.py`` trains one
step of a tiny Qwen3.5 at a 131k vocabulary on seed-like datums (long prompts, few trained
tokens, rows training different columns) with the old B x K x V path and the new one, each
in its own process, and the new path's measured peak extra RSS is at most 25% of the old
one's, with the same loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_chunked_logprobs_use_at_most_a_quarter_of_the_old_peak_memory() -> None:
    args = ["--vocab", "131072", "--datums", "8", "--prompt", "64", "--chunk", "32"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "learner_memory.py"), *args, "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    old, new = report["old"], report["new"]
    assert new["chunked"] is True and old["chunked"] is False
    # The old path holds ~4 fp32 copies of 8 x 48 x 131072 logits (200 MB each); measured
    # ~875 MB extra against ~80 MB for the new one (ratio ~0.1; the bound leaves 2.5x).
    assert old["extra_mb"] > 400, report
    assert new["extra_mb"] <= 0.25 * old["extra_mb"], report
    # Both paths in float32 (the figures are float32's memory); their exact agreement is
    # checked in float64 by test_learner_chunked_logits. Here, a bound from the dtype: each
    # of the 8 x 48 log-probs (|lp| <= log V = 11.8) is a sum over V = 2**17 columns taken in
    # another order, off by at most log2(V) * u32 = 17 * 6e-8 of it: 384 * 11.8 * 1e-6.
    assert report["loss_abs_diff"] <= 4.6e-3, report
