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

import sys
from pathlib import Path

from searchr1.core.config_schema import HealthSettings
from searchr1.core.health import HealthMonitor
from searchr1.core.logs import read_jsonl

FOLLOW_UPS = "health/follow_up_searches"


def step_searches(events: Path) -> list[dict[str, float]]:
    """Each RL step's search signals (``searches`` and follow-up searches a trajectory), in
    step order."""
    steps = []
    for event in read_jsonl(events)[0]:  # a line a crash cut short is skipped
        if event.get("event") == "metrics" and "searches_per_trajectory" in event:
            searches = float(event["searches_per_trajectory"])
            follow_ups = float(event.get(FOLLOW_UPS, max(0.0, searches - 1)))
            steps.append({"searches": searches, FOLLOW_UPS: follow_ups})
    return steps


def first_alerts(steps: list[dict[str, float]]) -> dict[str, int]:
    """The step (from 1) at which each search alarm first fires: the run's own monitor."""
    monitor = HealthMonitor(HealthSettings())
    fired: dict[str, int] = {}
    for step, signals in enumerate(steps, 1):
        for alert in monitor.cliff_alerts(signals):
            fired.setdefault(alert.kind, step)
    return fired


def main(folders: list[str]) -> None:
    seen: set[tuple[float, ...]] = set()
    print("| run | steps | search_cliff | follow_up_cliff | searches: first / peak / last |")
    print("|---|---|---|---|---|")
    for folder in folders:
        for events in sorted(Path(folder).rglob("events.jsonl")):
            steps = step_searches(events)
            searches = [s["searches"] for s in steps]
            key = tuple(round(s, 4) for s in searches)
            if not steps or key in seen:
                continue
            seen.add(key)
            fired = first_alerts(steps)
            print(
                f"| {events.parent} | {len(steps)} | {fired.get('search_cliff', '-')} | "
                f"{fired.get('follow_up_cliff', '-')} | "
                f"{searches[0]:.2f} / {max(searches):.2f} / {searches[-1]:.2f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
