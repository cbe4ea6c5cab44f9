"""Structured logs: JSON lines with run id and level, secrets redacted everywhere."""

from __future__ import annotations

import io
import json
from pathlib import Path

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
