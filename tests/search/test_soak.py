"""The soak, shortened: ``bench/soak.py --steps 8`` trains through ``searchr1 train`` with
``max_staleness = 1`` against a flaky search service (a quota-exhausted key, injected faults,
one restart) and must lose no step, print no traceback and hold its threads and file
descriptors (bounds, not timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_loses_no_step_and_leaks_no_thread_or_descriptor(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--steps", "8", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0, (tmp_path / "output.txt").read_text()[-3000:]
    assert result["steps_logged"] and not result["traceback"]
    assert result["restarts"] == 1
    assert result["faults"].get("429", 0) >= 1  # at least the quota-exhausted key's
    assert result["keys_benched"] >= 1
    threads, fds = result["threads"], result["fds"]
    # start (step 3) -> end (step 7): new threads may only come
    # from asyncio's default executor (asyncio.to_thread: the learner, name lookups), which
    # starts its workers on demand up to min(32, cpus + 4); a thread per search or per fault
    # (~60 searches here) would pass that
    executor = min(32, (os.cpu_count() or 1) + 4)
    assert threads[1] <= threads[0] + executor, result
    # the only descriptors that come and go between steps are the search pool's connections:
    # at most max_concurrency = 4 of them
    assert fds[1] <= fds[0] + 4, result
