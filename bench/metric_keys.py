"""Keys of a run's ``metrics`` events: how many, how long a line is, which never change.

    python bench/metric_keys.py runs/<run>            # a run folder (its events.jsonl)
    python bench/metric_keys.py runs/<run> --json     # the same as one JSON line

Reads ``events.jsonl`` and prints: the number of ``metrics`` events (steps), the number of
distinct keys over them (the event's bookkeeping fields ``event``, ``run_id``, ``level``,
``timestamp`` and its ``step`` not counted, as issue 48 counts), the most keys of one event, the mean bytes of a
``metrics`` line, and the keys whose value is the same on every step: those constant at 0
first (issue 48's check: none), then the other constants. A key present on only some steps
(a sparse diagnostic) counts as constant only if every value it has is the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BOOKKEEPING = frozenset({"event", "run_id", "level", "timestamp", "logger", "step"})


def summarize(run_dir: Path) -> dict[str, object]:
    lines = [
        line
        for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
        if '"metrics"' in line
    ]
    events = [e for e in map(json.loads, lines) if e.get("event") == "metrics"]
    values: dict[str, set[object]] = {}
    for event in events:
        for key, value in event.items():
            if key not in BOOKKEEPING:
                values.setdefault(key, set()).add(value)
    constant = {k: next(iter(v)) for k, v in values.items() if len(v) == 1}
    zero = sorted(k for k, v in constant.items() if v == 0)
    return {
        "steps": len(events),
        "keys": len(values),
        "max_keys_per_event": max((len(set(e) - BOOKKEEPING) for e in events), default=0),
        "mean_line_bytes": round(sum(map(len, lines)) / len(lines)) if lines else 0,
        "constant_zero": zero,
        "constant_other": {k: v for k, v in sorted(constant.items()) if k not in zero},
        "sparse": sorted(k for k in values if sum(k in e for e in events) < len(events)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    s = summarize(args.run_dir)
    if args.json:
        print(json.dumps(s))
        return 0
    print(
        f"steps {s['steps']}  keys {s['keys']} (at most {s['max_keys_per_event']} in one "
        f"event)  {s['mean_line_bytes']} bytes per metrics line"
    )
    print(f"constant 0 ({len(s['constant_zero'])}): {' '.join(s['constant_zero']) or '-'}")
    other = s["constant_other"]
    print(f"other constants ({len(other)}): " + " ".join(f"{k}={v}" for k, v in other.items()))
    print(f"sparse ({len(s['sparse'])}): {' '.join(s['sparse']) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
