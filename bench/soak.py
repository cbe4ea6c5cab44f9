"""A long pipelined run under a flaky, restarted search service: does anything leak or get lost?

    python bench/soak.py                  # 24 steps, 20% of searches faulted, one restart
    python bench/soak.py --steps 8        # what the CI test runs (tests/search/test_soak.py)

``searchr1 train`` (a child process) trains the offline world's tiny model (real torch, LoRA)
with ``[train] max_staleness = 1`` (rollouts one step ahead of the learner) and searches the
``zhihu`` provider against a loopback fake of the service (``tests/helpers/search_fakes.py``):

* three keys: two good, one whose quota is gone (every call a 429 with ``Retry-After: 1``, so
  it is benched, probed each second and benched again);
* ``--fault-rate`` of the other requests answered with a fault drawn at random (seeded):
  ``slow`` (longer than the 1 s timeout), ``503``, ``429`` (with ``Retry-After: 1``), ``code``
  (an API error inside an HTTP 200) or ``drop`` (the connection closed without an answer);
* ``--restarts`` times (at evenly spaced steps) the service goes away for ``--down-s``
  seconds and comes back on the same port: connections are refused meanwhile.

The run caches nothing (``cache = false``, ``disk_cache = false``): every search reaches the
service, through at most 4 connections (``max_concurrency = 4``). The child's resident memory
(``VmRSS``), open file descriptors and threads are read from ``/proc`` as each step's metrics
are logged (``trace.jsonl`` in the run's folder); the start is step :data:`WARM_STEP`'s (the
model loaded, the pipeline's worker and the connection pool up), the end the step before the
last's (the last step's may be read while the run already shuts its pipeline down). Ends with one JSON line: ``steps`` asked and
``steps_logged``, ``exit_code``, ``traceback`` (whether the output holds one), the faults
injected by kind, ``restarts``, ``guard_waits`` (steps rolled out again because search
success fell under ``min_success_rate``), key bench/unbench events, search calls, and
``rss_mb``/``fds``/``threads`` as ``[start, end, max]``. Linux only (``/proc``).

``--spend`` measures instead what the answers kept on disk save (the same run, no faults,
``disk_cache = true``, a store of its own): a run of ``--steps`` steps (checkpoints at half and
at the end), a rerun of the same config in a new folder, and a resume after a crash (the last
checkpoint deleted: the steps after the half are done again), each against the same run with
``--no-cache``. One JSON line: the service's requests for each, and the calls saved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))  # the loopback fake lives with the tests

from search_fakes import Behaviour, start_fake_zhihu  # noqa: E402

KEYS = ("soak-good-0000", "soak-quota-1111", "soak-good-2222")
#: the step whose figures are the start: by then the model is loaded, the pipeline's worker
#: thread and the search connection pool are up (the child gains its last thread at step 2-3)
WARM_STEP = 3

CONFIG = """\
[run]
seed = 0
[model]
provider = "local"
base_model = "builtin:tiny"
temperature = 0.7
top_p = 1.0
max_new_tokens = 24
[lora]
rank = 8
alpha = 16
dropout = 0.0
[rollout]
protocol = "tags"
questions_per_batch = 4
group_size = 4
max_search_calls = 3
max_assistant_turns = 4
max_trajectory_tokens = 448
max_observation_tokens = 96
dynamic_sampling = false
[search]
provider = "zhihu"
api_base = "{base_url}"
api_keys = "${{SOAK_SEARCH_KEYS}}"
top_k = 2
max_concurrency = 4
timeout_seconds = 1
max_retries = 2
cache = false
disk_cache = false
[reward]
name = "format_answer"
[train]
max_steps = {steps}
save_every = {save_every}
max_staleness = 1
eval_before_after = false
dump_trajectories = 2
guard_max_waits = 6
guard_backoff_seconds = 0.5
max_datum_tokens = 448
[optimizer]
lr = 2e-3
[data]
train = "builtin:world/train.jsonl"
"""


def proc_stats(pid: int) -> dict[str, float]:
    """Resident memory (MB), open file descriptors and threads of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "fds": float(len(os.listdir(f"/proc/{pid}/fd"))),
        "threads": float(fields["Threads"]),
    }


def _events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Whole lines of ``path`` from byte ``offset`` on, parsed, and the new offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", "replace").splitlines()
    return [json.loads(x) for x in lines if x.strip()], offset + end


def soak(
    steps: int,
    fault_rate: float,
    restarts: int,
    down_s: float,
    workdir: Path,
    seed: int = 0,
    provider: str = "zhihu",
) -> dict[str, Any]:
    """Run the soak in ``workdir``; the result dict (see the module docstring)."""
    behaviour = Behaviour(
        key_status={KEYS[1]: 429}, retry_after="1", fault_rate=fault_rate, seed=seed, slow_s=3.0
    )
    records: list[Any] = []
    restart_at = {round(steps * (i + 1) / (restarts + 1)) for i in range(restarts)} - {0, steps}
    run_dir = workdir / "run"
    events_path = run_dir / "events.jsonl"
    out_path = workdir / "output.txt"
    cm = start_fake_zhihu(behaviour)
    base_url, server = cm.__enter__()
    port = int(base_url.rsplit(":", 1)[1])
    config = workdir / "soak.toml"
    text = CONFIG.format(base_url=base_url, steps=steps, save_every=max(1, steps // 3))
    if provider == "local":  # the control: the same run without the search service
        text = text.replace('provider = "zhihu"', 'provider = "local"')
        text = text.replace(
            "[reward]", '[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n[reward]'
        )
    config.write_text(text, encoding="utf-8")
    env = {
        **os.environ,
        "SOAK_SEARCH_KEYS": ",".join(KEYS),
        "PYTHONUNBUFFERED": "1",
        "SEARCHR1_LOAD_PLUGINS": "",
    }
    cmd = [sys.executable, "-m", "searchr1.cli", "train", "--config", str(config)]
    t0 = time.perf_counter()
    samples: list[dict[str, float]] = []
    start = end = None
    seen: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []  # the child's figures at every step (trace.jsonl)
    restarted = 0
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, "--run-dir", str(run_dir)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
        offset = 0
        try:
            while True:
                done = proc.poll() is not None
                if not done:  # sampled before reading: a step read now was still running
                    try:
                        samples.append(proc_stats(proc.pid))
                    except (FileNotFoundError, ProcessLookupError, KeyError):
                        pass
                new, offset = _events(events_path, offset)
                seen += new
                for e in new:
                    if e.get("event") != "metrics" or done:
                        continue
                    stats = samples[-1] if samples else None
                    trace.append({"step": e.get("step"), **(stats or {})})
                    if e.get("step") == min(WARM_STEP, steps):
                        start = stats
                    if e.get("step") == steps - 1:
                        end = stats
                    if e.get("step") in restart_at:
                        restart_at.discard(e["step"])
                        # the service goes away (refused connections) and comes back
                        records += server.records
                        cm.__exit__(None, None, None)
                        time.sleep(down_s)
                        behaviour.seed += 1  # new faults, not the first ones again
                        cm = start_fake_zhihu(behaviour, port=port)
                        _, server = cm.__enter__()
                        restarted += 1
                if done:
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            records += server.records
            cm.__exit__(None, None, None)
    output = out_path.read_text(errors="replace")
    (workdir / "trace.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trace))
    metrics = [e for e in seen if e.get("event") == "metrics"]
    faults = Counter(r.action for r in records if r.action != "ok")
    names = Counter(str(e.get("event")) for e in seen)

    def triple(key: str) -> list[float | None]:
        values = [s[key] for s in samples]
        return [
            round(start[key], 1) if start else None,
            round(end[key], 1) if end else None,
            round(max(values), 1) if values else None,
        ]

    return {
        "bench": "soak",
        "steps": steps,
        "steps_logged": sorted({int(m["step"]) for m in metrics}) == list(range(1, steps + 1))
        and len(metrics) == steps,
        "exit_code": proc.returncode,
        "traceback": "Traceback" in output,
        "faults": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "restarts": restarted,
        "requests": len(records),
        "search_calls": int(sum(m.get("search/calls", 0) for m in metrics)),
        "search_success_min": min((m.get("search/success_rate", 1.0) for m in metrics), default=0),
        "guard_waits": names["guard/no_update"],
        "keys_benched": names["search_key_benched"],
        "keys_unbenched": names["search_key_unbenched"],
        "measured_steps": [min(WARM_STEP, steps), steps - 1],
        "rss_mb": triple("rss_mb"),
        "fds": triple("fds"),
        "threads": triple("threads"),
        "seconds": round(time.perf_counter() - t0, 1),
        "max_staleness": 1,
        "cpu": platform.processor() or platform.machine(),
    }


def _train(config: Path, run_dir: Path, env: dict[str, str], *extra: str) -> None:
    cmd = [sys.executable, "-m", "searchr1.cli", "train", "--config", str(config)]
    proc = subprocess.run(
        [*cmd, "--run-dir", str(run_dir), *extra], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"train {' '.join(extra)} failed:\n{proc.stdout[-3000:]}")


def spend(steps: int, workdir: Path) -> dict[str, Any]:
    """The calls a rerun and a resume save with the answers kept on disk."""
    half = max(1, steps // 2)
    env = {
        **os.environ,
        "SOAK_SEARCH_KEYS": f"{KEYS[0]},{KEYS[2]}",
        "SEARCHR1_LOAD_PLUGINS": "",
        "SEARCHR1_SEARCH_CACHE": str(workdir / "answers"),
    }
    paid: dict[str, int] = {}
    with start_fake_zhihu() as (base_url, server):
        config = workdir / "spend.toml"
        text = CONFIG.format(base_url=base_url, steps=steps, save_every=half)
        text = text.replace("disk_cache = false", "disk_cache = true")
        config.write_text(text.replace("cache = false", "cache = true"))  # the defaults

        def measure(name: str, run_dir: Path, *extra: str) -> None:
            before = len(server.records)
            _train(config, run_dir, env, *extra)
            paid[name] = len(server.records) - before

        measure("first", workdir / "first")
        for name in ("resume", "resume_no_cache"):  # a crash after the last step
            shutil.copytree(workdir / "first", workdir / name)
            shutil.rmtree(workdir / name / "checkpoints" / f"step_{steps:06d}")
        measure("rerun", workdir / "rerun")
        measure("rerun_no_cache", workdir / "rerun_no_cache", "--no-cache")
        measure("resume", workdir / "resume", "--resume")
        measure("resume_no_cache", workdir / "resume_no_cache", "--resume", "--no-cache")
    return {
        "bench": "search_spend",
        "steps": steps,
        "steps_redone_on_resume": steps - half,
        "requests": paid,
        "rerun_saved": paid["rerun_no_cache"] - paid["rerun"],
        "resume_saved": paid["resume_no_cache"] - paid["resume"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--down-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--provider",
        choices=("zhihu", "local"),
        default="zhihu",
        help="local: the control run, BM25 in the process and no service (no faults)",
    )
    parser.add_argument("--spend", action="store_true", help="measure the disk cache instead")
    parser.add_argument("--keep", help="folder to run in and keep (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.spend:
            print(json.dumps(spend(args.steps, workdir)))
            return
        result = soak(
            args.steps,
            args.fault_rate,
            args.restarts,
            args.down_s,
            workdir,
            args.seed,
            args.provider,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
