"""Read what a run folder holds, for the report: metric series, eval results, trajectories.

Called once by :func:`searchr1.report.build_report`. Everything here is tolerant: a run that
crashed mid-line, or an older run without some metric, still gives a report (unreadable
lines are counted, missing metrics are simply absent).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.checkpoint import checkpoints_dir
from searchr1.core.logs import read_jsonl

#: event fields that are bookkeeping, never metrics
_META_KEYS = frozenset({"event", "step", "timestamp", "level", "run_id", "logger"})
#: events that start with "eval" but are not results
_NOT_EVAL_RESULTS = frozenset({"eval_start"})
_STEP_FILE_RE = re.compile(r"step_(\d+)\.jsonl$")
#: the events that say how a process of the run began or ended (the last one read wins)
_ENDINGS = frozenset({"run_start", "train_stopped", "stopped", "train_done"})


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class RunLog:
    """Everything the report shows, read from one run folder."""

    run_dir: Path
    run_id: str = ""
    #: metric name -> [(step, value)] in log order
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: eval result events, as logged
    evals: list[dict[str, Any]] = field(default_factory=list)
    #: step -> trajectories dumped at that step
    trajectories: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: eval label -> per-question records
    eval_records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bad_lines: int = 0
    #: the run_start event (command, config source) when present
    start: dict[str, Any] = field(default_factory=dict)
    #: ``health_alert`` events (step, kind, message), in log order
    alerts: list[dict[str, Any]] = field(default_factory=list)
    #: the train loop's start message on what the importance ratio compares
    ratio_basis: str = ""
    #: the newest checkpoint's ``config.toml`` (secrets already redacted when it was saved)
    config_text: str = ""
    #: how the newest process of the run ended: its last ``run_start``, ``train_stopped``,
    #: ``stopped`` or ``train_done`` event (a ``run_start`` last: still running, or killed)
    ending: dict[str, Any] = field(default_factory=dict)
    #: ``judge_failures`` events (every batch of judge calls with failures, the steps the
    #: guard did not train included)
    judge_failures: list[dict[str, Any]] = field(default_factory=list)
    #: the last ``train_done`` event (its run totals count every process of the run)
    done: dict[str, Any] = field(default_factory=dict)

    @property
    def last_step(self) -> int | None:
        steps = [s for points in self.series.values() for s, _ in points]
        return int(max(steps)) if steps else None


def load_run(run_dir: Path) -> RunLog:
    """Read ``run_dir``; raises ``FileNotFoundError`` only when the folder does not exist or
    holds neither events nor trajectories."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a folder")
    log = RunLog(run_dir=run_dir, run_id=run_dir.name)
    events_path = run_dir / "events.jsonl"
    if events_path.is_file():
        events, log.bad_lines = read_jsonl(events_path)
        for event in events:
            _add_event(log, event)
    traj_dir = run_dir / "trajectories"
    if traj_dir.is_dir():
        for path in sorted(traj_dir.glob("step_*.jsonl")):
            match = _STEP_FILE_RE.search(path.name)
            if match:
                rows, bad = read_jsonl(path)
                log.trajectories[int(match.group(1))] = rows
                log.bad_lines += bad
    # In the order they were written (held-out "before" ahead of "after").
    for path in sorted(run_dir.glob("eval_*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name)):
        rows, bad = read_jsonl(path)
        log.eval_records[path.stem.removeprefix("eval_")] = rows
        log.bad_lines += bad
    saved = sorted(checkpoints_dir(run_dir).glob("step_*/config.toml"))
    if saved:
        log.config_text = saved[-1].read_text(encoding="utf-8", errors="replace")
    if not events_path.is_file() and not log.trajectories and not log.eval_records:
        raise FileNotFoundError(
            f"{run_dir}: no events.jsonl, trajectories/ or eval_*.jsonl (is it a run folder?)"
        )
    return log


def _add_event(log: RunLog, event: dict[str, Any]) -> None:
    name = str(event.get("event", ""))
    if name in _ENDINGS:
        log.ending = event
    if name == "run_start":
        log.start = event
        log.run_id = str(event.get("run_id") or log.run_id)
    elif name == "train_done":
        log.done = event
    elif name == "judge_failures":
        log.judge_failures.append(event)
    elif name == "metrics" and is_number(event.get("step")):
        step = float(event["step"])
        for key, value in event.items():
            if key not in _META_KEYS and is_number(value):
                log.series.setdefault(key, []).append((step, float(value)))
    elif name.startswith("eval") and name not in _NOT_EVAL_RESULTS:
        log.evals.append(event)
    elif name == "health_alert":
        log.alerts.append(event)
    elif name == "importance_ratio":
        log.ratio_basis = str(event.get("message", ""))
