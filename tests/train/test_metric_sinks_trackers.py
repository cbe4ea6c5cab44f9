"""The optional W&B and SwanLab sinks, run in their offline modes (no network here) through
the same path training uses (``open_sinks``, then the loop's calls), and read back from the
files they wrote. Skipped, with the install line, where the extra is not installed."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from tracker_logs import records

from searchr1.core.config import parse_config
from searchr1.core.errors import UserError
from searchr1.core.logs import setup_logging
from searchr1.core.plugins import load_registry
from searchr1.core.sinks import open_sinks

CANARY = "sk-canary-tracker-5d1e07"
TRAJECTORY = {
    "question": "Who founded Zebel Group?",
    "golden_answers": ["Pesbel Zozi"],
    "turns": [{"text": "<answer> Pesbel Zozi </answer>", "observation_text": None}],
    "final_answer": "Pesbel Zozi",
    "end_reason": "answered",
    "reward": 1.0,
    "components": {"format": 1.0, "correct": 1.0},
}


def _run(sink: str, tmp_path: Path, table: str) -> Path:
    """Two logged steps plus a held-out EM and one trajectory, with a canary secret in the
    config and in a log message; returns the run folder."""
    cfg = parse_config(
        f'[model]\napi_key = "{CANARY}"\n[log]\nsinks = ["{sink}"]\n{table}',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    run_dir = tmp_path / "train-test"
    setup_logging(
        run_dir.name,
        run_dir / "events.jsonl",
        secrets=cfg.secrets,
        stream=io.StringIO(),
    )
    sinks = open_sinks(cfg, load_registry(), run_dir)
    sinks.scalars(1, {"reward/mean": 0.25, "search_rate": 0.5, "note": f"key {CANARY}"})
    sinks.trajectories(1, [{**TRAJECTORY, "question": f"leak {CANARY}?"}])
    sinks.scalars(2, {"reward/mean": 0.75, "search_rate": 0.625})
    sinks.scalars(2, {"eval/heldout_em": 0.5, "eval/heldout_n": 10})
    sinks.close()
    return run_dir


def _wandb_records(log: Path, record_cls: type) -> list:
    """The run's records once W&B's writer (a separate service process, which may still be
    writing after ``run.finish()`` returns) has written the final ``exit`` record."""
    deadline = time.monotonic() + 30
    while True:
        parsed = [record_cls.FromString(raw) for raw in records(log)]
        if any(r.WhichOneof("record_type") == "exit" for r in parsed):
            return parsed
        assert time.monotonic() < deadline, "W&B never finished writing the offline run"
        time.sleep(0.1)


def test_wandb_offline_run_has_steps_config_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="W&B sink: pip install 'searchr1[wandb]'")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _run("wandb", tmp_path, '[log.wandb]\nproject = "sinks-test"\n')
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    parsed = _wandb_records(log, wandb_internal_pb2.Record)
    history: dict[int, dict] = {}
    config: dict[str, object] = {}
    for rec in parsed:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
    assert history[1]["reward/mean"] == 0.25 and history[2]["reward/mean"] == 0.75
    assert history[2]["eval/heldout_em"] == 0.5
    assert history[1]["trajectories/_type"] == "table-file"
    assert config["model"]["api_key"] == "***" and config["log"]["sinks"] == ["wandb"]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert all(CANARY.encode() not in p.read_bytes() for p in files)
    (table,) = run_dir.glob("wandb/offline-run-*/files/media/table/trajectories_1_*.json")
    assert "Who founded" not in table.read_text() and "leak ***?" in table.read_text()


def test_swanlab_offline_run_has_steps_config_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("swanlab", reason="SwanLab sink: pip install 'searchr1[swanlab]'")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    run_dir = _run("swanlab", tmp_path, '[log.swanlab]\nmode = "offline"\n')
    (log,) = run_dir.glob("swanlab/run-*/run-*.swanlab")
    scalars: dict[tuple[str, int], float] = {}
    media: list[tuple[str, int]] = []
    for raw in records(log):
        rec = Record.FromString(raw)
        if rec.HasField("scalar"):
            scalars[(rec.scalar.key, rec.scalar.step)] = rec.scalar.value.number
        elif rec.HasField("media"):
            media.append((rec.media.key, rec.media.step))
        assert not rec.HasField("log"), "terminal output must not be captured"
    assert scalars[("reward/mean", 1)] == 0.25 and scalars[("reward/mean", 2)] == 0.75
    assert scalars[("eval/heldout_em", 2)] == 0.5
    assert media == [("trajectories", 1)]
    (config,) = run_dir.glob("swanlab/run-*/files/config.yaml")
    assert "api_key" in config.read_text() and "'***'" in config.read_text()
    texts = [p.read_text() for p in run_dir.glob("swanlab/run-*/media/text/*")]
    assert len(texts) == 1 and "leak ***?" in texts[0]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert all(CANARY.encode() not in p.read_bytes() for p in files)


def test_wandb_online_without_a_key_stops_at_start_instead_of_prompting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="W&B sink: pip install 'searchr1[wandb]'")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no saved W&B settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    wandb.teardown()  # forget settings an earlier (offline) test set up in this process
    cfg = parse_config(
        '[log]\nsinks = ["wandb"]\n[log.wandb]\nmode = "online"\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    with pytest.raises(UserError, match=r"no API key here: set WANDB_API_KEY.*mode = \"offline\""):
        open_sinks(cfg, load_registry(), tmp_path / "run")
    assert not (tmp_path / "run" / "wandb").exists()


def test_swanlab_online_without_a_key_stops_at_start_instead_of_prompting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("swanlab", reason="SwanLab sink: pip install 'searchr1[swanlab]'")
    for var in ("SWANLAB_API_KEY", "SWANLAB_MODE", "SWANLAB_ROOT", "SWANLAB_SAVE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no saved SwanLab login
    cfg = parse_config(
        '[log]\nsinks = ["swanlab"]\n[log.swanlab]\nmode = "online"\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    with pytest.raises(UserError, match=r"not logged in.*SWANLAB_API_KEY.*mode = \"offline\""):
        open_sinks(cfg, load_registry(), tmp_path / "run")
