"""Stop latency per phase: seconds from a SIGINT/SIGTERM to the ``searchr1`` process's exit.

    python bench/stop_latency.py              # every phase, the tiny model on the CPU
    python bench/stop_latency.py --repeat 3   # each phase three times (min / median / max)

Each phase is a real ``searchr1`` process on the offline world (``builtin:tiny``), signalled
when its JSON events say it is in that phase (what ``tests/cli/test_stops.py`` checks, timed
here): the model load (``smoke``, at "search keys:"), the held-out eval "before" (``train``,
as it begins), a cold-start step, a periodic held-out eval after step 1 (the step
is checkpointed), RL step 1 (finished and checkpointed: the one phase that runs to the end of
its unit), ``searchr1 eval`` and ``searchr1 index build``. Prints one JSON line per phase
(``exit``, ``seconds``) and a summary line. The latency includes the process's own exit
(closing the model, the interpreter's teardown), not only the phase's end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from cli_run import make_config  # noqa: E402

HELDOUT = "builtin:world/heldout.jsonl"
PLAIN = {"train": {"eval_before_after": False, "max_steps": 3, "save_every": 3}}


def _event(name: str, **fields: Any) -> Callable[[str], bool]:
    def match(line: str) -> bool:
        try:
            e = json.loads(line)
        except ValueError:
            return False
        return isinstance(e, dict) and e.get("event") == name and fields.items() <= e.items()

    return match


def _text(text: str) -> Callable[[str], bool]:
    return lambda line: text in line


def phases(folder: Path) -> dict[str, tuple[list[str], Callable[[str], bool], signal.Signals]]:
    """name -> (searchr1 arguments, the line that marks the phase, the signal)."""

    def config(name: str, text: str) -> str:
        path = folder / f"{name}.toml"
        path.write_text(text)
        return str(path)

    before = config(
        "before", make_config(train={"eval_before_after": True}, data={"eval": HELDOUT})
    )
    cold = config(
        "cold", make_config(PLAIN, train={"cold_start": {"steps": 4, "questions_per_step": 8}})
    )
    periodic = config(
        "periodic",
        make_config(
            train={"max_steps": 1, "eval_every": 1, "eval_questions": 32},
            data={"eval": HELDOUT},
        ),
    )
    step = config("step", make_config(PLAIN, rollout={"questions_per_batch": 4, "group_size": 4}))
    evaluation = config("eval", make_config(data={"eval": HELDOUT}))
    corpus = folder / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(40_000):
            f.write(json.dumps({"id": str(i), "contents": f"Passage {i}: Ros{i % 13}"}) + "\n")
    return {
        "model load (smoke)": (["smoke", "--config", evaluation], _text("search keys:"), signal.SIGINT),
        'held-out eval "before"': (
            ["train", "--config", before],
            _event("progress", task="held-out eval before", done=0),
            signal.SIGINT,
        ),
        "cold start": (["train", "--config", cold], _event("cold_start.step", step=1), signal.SIGTERM),
        "periodic eval of step 1": (
            ["train", "--config", periodic],
            _event("progress", task="held-out eval step_1", done=0),
            signal.SIGINT,
        ),
        "RL step 1 (finished)": (["train", "--config", step], _event("importance_ratio"), signal.SIGINT),
        "searchr1 eval": (["eval", "--config", evaluation], _event("eval_start"), signal.SIGTERM),
        "index build": (["index", "build", str(corpus)], _event("index_progress"), signal.SIGINT),
    }  # fmt: skip


def measure(args: list[str], mark: Callable[[str], bool], sig: signal.Signals, run: Path) -> dict:
    extra = ["--out", str(run)] if args[0] == "index" else ["--run-dir", str(run)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchr1", *args, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if mark(line):
            break
    else:
        raise SystemExit(f"{args}: exited {proc.wait()} before its phase")
    t0 = time.perf_counter()
    proc.send_signal(sig)
    proc.communicate(timeout=600)
    return {"exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, (argv, mark, sig) in phases(folder).items():
            seconds = []
            for i in range(args.repeat):
                run = folder / f"run-{len(summary)}-{i}"
                result = measure(argv, mark, sig, run)
                print(json.dumps({"phase": name, "signal": sig.name, **result}), flush=True)
                seconds.append(result["seconds"])
            summary[name] = {
                "min": min(seconds),
                "median": statistics.median(seconds),
                "max": max(seconds),
            }
    print(json.dumps({"stop_latency_s": summary, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
