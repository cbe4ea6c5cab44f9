"""Structured logs: JSON lines with run id and level, secrets redacted everywhere."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import structlog

from searchr1.core.logs import get_logger, log_metrics, setup_logging


def test_json_events_to_file_and_stream_with_redaction(tmp_path: Path) -> None:
    stream = io.StringIO()
    events = tmp_path / "run" / "events.jsonl"
    setup_logging("run-1", events, secrets=["sk-live-secret-42"], stream=stream)
    log = get_logger()
    log.info(
        "request",
        url="https://x/api?key=sk-live-secret-42",
        headers={"Authorization": "Bearer abcdef123456"},
    )
    log_metrics(3, {"reward/mean": 0.5, "search/success_rate": 1.0})
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["request", "metrics"]
    for e in lines:
        assert e["run_id"] == "run-1" and e["level"] == "info" and "timestamp" in e
    assert lines[1]["step"] == 3 and lines[1]["reward/mean"] == 0.5
    text = events.read_text() + stream.getvalue()
    assert "sk-live-secret-42" not in text and "abcdef123456" not in text
    assert "***" in lines[0]["url"] and lines[0]["headers"]["Authorization"] == "Bearer ***"
    assert stream.getvalue().count("\n") == 2


def test_an_event_racing_the_runs_close_is_not_lost_and_writes_no_stale_descriptor(
    tmp_path: Path, capsys: Any
) -> None:
    """The stop announcer thread may log while the run closes its stream: its event goes to
    stderr, never to a closed (possibly reused) descriptor, and raises nothing."""
    events = tmp_path / "events.jsonl"
    run_log = setup_logging("run-2", events, stream=io.StringIO())
    get_logger().info("before_close")
    old_chain = structlog.get_config()["processors"]
    other = tmp_path / "other.txt"
    run_log.close()
    with other.open("w") as fh:  # likely takes the closed events file's descriptor number
        event = {"event": "stop_requested", "signal": "SIGTERM"}
        for processor in old_chain[:-1]:  # what a thread that began before close() runs
            event = processor(None, "warning", event)
        fh.write("mine\n")
    get_logger().warning("after_close")
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == [
        "before_close"
    ]
    assert other.read_text() == "mine\n"
    assert '"after_close"' in capsys.readouterr().err
