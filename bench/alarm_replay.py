"""The search alarms replayed on runs that already ended: for each ``events.jsonl`` under the
folders given, the step at which ``search_cliff`` and ``follow_up_cliff`` fire under the
default ``[train.health]`` settings, fed each step's logged searches a trajectory.

A run logged before ``health/follow_up_searches`` existed gets each step's mean minus one
(at least 0) as its follow-up searches: the metric's value when every trajectory searched at
least once, a little under it otherwise. Runs with the same searches at every step (RLOO
and GRPO under clipping, docs/training.md) are shown once::

    python bench/alarm_replay.py RUNS_OR_BENCH_OUT [...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from searchr1.core.config_schema import HealthSettings
from searchr1.core.health import CLIFF_FLOORS, CLIFFS, HealthMonitor

SEARCHES, FOLLOW_UPS = "searches", "health/follow_up_searches"


def step_searches(events: Path) -> list[tuple[float, float]]:
    """Each RL step's (searches, follow-up searches) a trajectory, in step order."""
    rows = []
    for line in events.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a run cut mid-line
            continue
        if event.get("event") == "metrics" and "searches_per_trajectory" in event:
            searches = float(event["searches_per_trajectory"])
            rows.append((searches, float(event.get(FOLLOW_UPS, max(0.0, searches - 1)))))
    return rows


def first_alerts(rows: list[tuple[float, float]]) -> dict[str, int | None]:
    """The step (from 1) at which each search alarm first fires, or None."""
    monitor = HealthMonitor(HealthSettings())
    kinds = {key: (kind, what, remedy) for key, kind, what, remedy in CLIFFS}
    fired: dict[str, int | None] = {kinds[SEARCHES][0]: None, kinds[FOLLOW_UPS][0]: None}
    for step, values in enumerate(rows, 1):
        for key, value in zip((SEARCHES, FOLLOW_UPS), values, strict=True):
            kind, what, remedy = kinds[key]
            alert = monitor.cliff(key, value, kind, what, remedy, CLIFF_FLOORS[key])
            if alert is not None and fired[kind] is None:
                fired[kind] = step
    return fired


def main(folders: list[str]) -> None:
    seen: set[tuple[float, ...]] = set()
    print("| run | steps | search_cliff | follow_up_cliff | searches: first / peak / last |")
    print("|---|---|---|---|---|")
    for folder in folders:
        for events in sorted(Path(folder).rglob("events.jsonl")):
            rows = step_searches(events)
            key = tuple(round(s, 4) for s, _ in rows)
            if not rows or key in seen:
                continue
            seen.add(key)
            fired = first_alerts(rows)
            searches = [s for s, _ in rows]
            print(
                f"| {events.parent} | {len(rows)} | {fired['search_cliff'] or '-'} | "
                f"{fired['follow_up_cliff'] or '-'} | "
                f"{searches[0]:.2f} / {max(searches):.2f} / {searches[-1]:.2f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
