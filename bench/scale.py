"""Seconds per training step and tokens per second of the offline demo with 1 and with N
data-parallel processes (``searchr1 train --nproc N``, torchrun + gloo on CPU, nccl on GPUs).

    python bench/scale.py                  # 1 vs 2 processes, 6 steps each
    python bench/scale.py --nproc 4 --steps 10 --threads 4

The demo (``searchr1/defaults/offline.toml``: tiny model, 8 questions x 8 trajectories a
step, dynamic sampling) with the held-out evals off and one checkpoint at the end. By
default both runs use every core: one process with ``cores`` torch threads, N processes
with ``cores / N`` each (``--threads T``: T threads a process in both runs instead, which
measures N times the cores against one). On one CPU the processes share the cores, so what
N processes can win there is what one process leaves idle (the rollout's Python between
forwards, one thread's poor scaling); the real gain needs a device per process. s/step is the
mean ``time/step`` of the steps after the first; tokens/s is sampled tokens (every rank's)
per second over the same steps. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

DEMO = Path(__file__).resolve().parents[1] / "searchr1" / "defaults" / "offline.toml"


def run(folder: Path, nproc: int, steps: int, threads: int) -> dict[str, Any]:
    """Train ``steps`` steps of the demo with ``nproc`` processes; the step figures."""
    config = tomllib.loads(DEMO.read_text())
    config["train"].update(max_steps=steps, save_every=steps, eval_before_after=False)
    config["model"].setdefault("local", {})["threads"] = threads
    path = folder / f"config-{nproc}.toml"
    path.write_text(tomli_w.dumps(config))
    run_dir = folder / f"run-{nproc}"
    command = [sys.executable, "-m", "searchr1", "train", "--config", str(path)]
    command += ["--run-dir", str(run_dir)]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{nproc} process(es) failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["event"] == "metrics"][1:]
    seconds = sum(m["time/step"] for m in metrics)
    return {
        "s_per_step": round(statistics.fmean(m["time/step"] for m in metrics), 3),
        "sampled_tokens_per_s": round(sum(m["tokens/sampled"] for m in metrics) / seconds, 1),
        "trained_tokens_per_s": round(sum(m["tokens/trained"] for m in metrics) / seconds, 1),
        "trajectories_per_step": statistics.fmean(m["trajectories"] for m in metrics),
        "threads_per_process": threads,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="per process; 0: cores / nproc")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    result: dict[str, Any] = {"bench": "scale", "cores": cores, "load_avg": os.getloadavg()[0]}
    result["machine"] = platform.processor() or platform.machine()
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in (1, args.nproc):
            threads = args.threads or max(1, cores // nproc)
            result[f"nproc_{nproc}"] = run(Path(tmp), nproc, args.steps, threads)
    one, many = result["nproc_1"], result[f"nproc_{args.nproc}"]
    result["speedup"] = round(one["s_per_step"] / many["s_per_step"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
