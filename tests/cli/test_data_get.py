"""``searchr1 data get nq-hotpotqa`` against a loopback server playing the Hugging Face hub
(``$HF_ENDPOINT``), serving parquet files in Search-R1's published layout: through the hub
client, and with no hub at all."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offline import closed_port

REPO = "PeterJinGo/nq_hotpotqa_train"


def _row(source: str, index: int, question: str, answers: list[str]) -> dict:
    """One row as Search-R1's data scripts write it (scripts/data_process/nq_search.py)."""
    prompt = f"Answer the given question. ... Question: {question}\n"
    return {
        "id": f"{'train' if source != 'bamboogle' else 'test'}_{index}",
        "question": question,
        "golden_answers": answers,
        "data_source": source,
        "prompt": [{"content": prompt, "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": answers}, "style": "rule"},
        "extra_info": {"index": index, "split": "train"},
    }


FILES = {
    "train.parquet": [
        _row("nq", 0, "who wrote the little prince", ["Antoine de Saint-Exupéry"]),
        _row("hotpotqa", 1, "Which city is larger, Lyon or Paris?", ["Paris"]),
    ],
    "test.parquet": [
        _row("nq", 0, "capital of france", ["Paris"]),
        _row("bamboogle", 0, "q2", ["a", "b"]),
    ],
}


def _parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def hub():
    """A loopback hub: ``/datasets/REPO/resolve/main/FILE``, with the headers the hub client
    reads (``X-Repo-Commit``, ``ETag``); yields the endpoint and the paths requested."""
    blobs = {name: _parquet(rows) for name, rows in FILES.items()}
    requested: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            requested.append(self.path)
            name = self.path.rsplit("/", 1)[-1]
            if not self.path.startswith(f"/datasets/{REPO}/resolve/main/") or name not in blobs:
                self.send_response(404)
                self.end_headers()
                return
            data = blobs[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", "a" * 40)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's names
            self._answer(False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(True)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", requested
    server.shutdown()
    server.server_close()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_data_get_writes_the_published_sets_as_qa_files(hub, tmp_path, run_cli, monkeypatch):
    endpoint, requested = hub
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    out = tmp_path / "nq"
    result = run_cli("data", "get", "nq-hotpotqa", "--out", out)
    assert result.code == 0, result.out + result.err
    assert any(p.endswith("/resolve/main/train.parquet") for p in requested)
    train, test = _rows(out / "train.jsonl"), _rows(out / "test.jsonl")
    assert train == [
        {"id": "nq/train_0", "question": "who wrote the little prince",
         "golden_answers": ["Antoine de Saint-Exupéry"], "data_source": "nq"},
        {"id": "hotpotqa/train_1", "question": "Which city is larger, Lyon or Paris?",
         "golden_answers": ["Paris"], "data_source": "hotpotqa"},
    ]  # fmt: skip
    assert [r["data_source"] for r in test] == ["nq", "bamboogle"]
    assert test[1]["golden_answers"] == ["a", "b"]
    assert f"{out / 'train.jsonl'}: 2 rows, 2 valid, 0 malformed" in result.out
    assert f'[data] train = "{out / "train.jsonl"}"' in result.out
    # what it wrote is a training file: config check no longer warns that train would stop
    config = tmp_path / "c.toml"
    corpus = '[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'  # what search needs
    config.write_text(f'[data]\ntrain = "{out / "train.jsonl"}"\n{corpus}', encoding="utf-8")
    check = run_cli("config", "check", "--config", config)
    assert check.code == 0 and "train would stop" not in check.out + check.err


def test_data_get_without_a_hub_says_what_to_do_and_from_converts_local_files(
    hub, tmp_path, run_cli, monkeypatch
):
    closed = closed_port()  # nobody listens there: the machine is offline
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    result = run_cli("data", "get", "nq-hotpotqa", "--out", tmp_path / "nq")
    assert result.code == 2, result.out + result.err
    assert "Traceback" not in result.err
    assert (
        f"could not download http://127.0.0.1:{closed}/datasets/{REPO}/resolve/main/train.parquet"
        in result.err
    )
    assert "--from DIR" in result.err and not (tmp_path / "nq" / "train.jsonl").exists()
    # files fetched elsewhere, converted here
    local = tmp_path / "downloaded"
    local.mkdir()
    for name, rows in FILES.items():
        (local / name).write_bytes(_parquet(rows))
    result = run_cli("data", "get", "nq-hotpotqa", "--out", tmp_path / "nq", "--from", local)
    assert result.code == 0, result.err
    assert len(_rows(tmp_path / "nq" / "train.jsonl")) == 2
