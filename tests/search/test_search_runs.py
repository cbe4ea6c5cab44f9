"""Search keys and search spend through ``searchr1 train``: a loopback Zhihu fake with a dead
key among good ones, and answers kept on disk that a rerun and a resumed run reuse."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import read_events
from search_fakes import start_fake_zhihu
from train_configs import train_config

KEYS = ["zk-good-0000-secret", "zk-dead-1111-secret", "zk-good-2222-secret"]
#: the searching trajectory of every group asks three questions, then answers
TURNS = [
    ["<search> prince author </search>", "<search> author birthplace </search>",
     "<search> lyon country </search>", "<answer> France </answer>"],
    ["<answer> Paris </answer>"],
]  # fmt: skip


def zhihu_config(tmp_path: Path, base_url: str, search: str = "", train: str = "") -> Path:
    """The scripted two-step run of ``train_configs`` searching the fake at ``base_url``."""
    config = train_config(tmp_path, train=train)
    text = config.read_text()
    head, _, rest = text.partition("[search]\n")
    rest = rest[rest.index("\n[", rest.index("[search.local]")) + 1 :]  # drop the local tables
    text = (
        head
        + f'[search]\nprovider = "zhihu"\napi_base = "{base_url}"\napi_keys = "{",".join(KEYS)}"\n'
        + f"top_k = 2\ntimeout_seconds = 5\n{search}\n"
        + rest
    )
    text = text.replace(
        text[text.index("turns = ") : text.index("\n", text.index("turns = "))],
        f"turns = {json.dumps(TURNS)}",
    )
    config.write_text(text)
    return config


def test_a_dead_key_among_good_ones_is_benched_and_the_run_keeps_its_pace(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    with start_fake_zhihu() as (base_url, server):
        server.behaviour.key_action = {KEYS[1]: "code"}  # every call: an API error in a 200
        config = zhihu_config(
            tmp_path,
            base_url,
            search="cache = false\ndisk_cache = false\n",
            train="guard_backoff_seconds = 30\n",
        )
        run = tmp_path / "run"
        result = run_cli("train", "--config", config, "--run-dir", run, "--max-steps", "3")
        dead_calls = [r for r in server.records if r.key == KEYS[1]]
    assert result.code == 0, result.err + result.out
    metrics = read_events(run, "metrics")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # every failure on the dead key was asked again on a good key: no failed search, no guard
    assert all(m["search/success_rate"] == 1.0 for m in metrics)
    assert not read_events(run, "guard/no_update")
    # a failure counter is in a step's event only when it is not 0
    assert sum(m.get("search/key_retries", 0) for m in metrics) == len(dead_calls) == 3
    assert sum(m["search/calls"] for m in metrics) == 18  # 3 steps x 2 groups x 3 searches
    assert metrics[-1]["search/keys_available"] == 2  # benched after 3 failures in a row
    (benched,) = read_events(run, "search_key_benched")
    assert benched["key_index"] == 1 and "Code 1001" in benched["reason"]
    assert benched["benched_for_s"] == 60
    log = (run / "events.jsonl").read_text() + result.out + result.err
    assert "key_index" in log and not any(key in log for key in KEYS)


def test_a_rerun_and_a_resumed_run_reuse_the_answers_kept_on_disk(
    tmp_path: Path, run_cli, scripted_plugin, _search_answer_store: Path
) -> None:
    with start_fake_zhihu() as (base_url, server):
        config = zhihu_config(tmp_path, base_url, search="cost_per_call = 0.015\n")
        first = tmp_path / "first"
        assert run_cli("train", "--config", config, "--run-dir", first).code == 0
        paid_first = len(server.records)
        assert paid_first == 3  # three distinct queries; the run cache answers the repeats
        assert sum(m["search/cost"] for m in read_events(first, "metrics")) == 3 * 0.015

        # a rerun in a new folder: every query is answered from disk, nothing is paid
        rerun = tmp_path / "rerun"
        assert run_cli("train", "--config", config, "--run-dir", rerun).code == 0
        assert len(server.records) == paid_first
        metrics = read_events(rerun, "metrics")
        assert sum(m["search/disk_hits"] for m in metrics) == 3
        assert sum(m["search/paid_calls"] for m in metrics) == 0
        assert "search/cost_total" not in metrics[-1]  # a run total: in train_done
        (done,) = read_events(rerun, "train_done")
        assert done["search/cost_total"] == 0 and done["search/disk_hits_total"] == 3

        # resuming the first run for two more steps: its queries come from disk again
        resumed = run_cli(
            "train", "--config", config, "--run-dir", first, "--resume", "--max-steps", "4"
        )
        assert resumed.code == 0, resumed.err
        assert len(server.records) == paid_first
        assert [m["step"] for m in read_events(first, "metrics")] == [1, 2, 3, 4]

        # the report sums what every logged step paid: 3 calls by the first run, none after
        assert run_cli("report", first, "--out", tmp_path / "report", "--no-png").code == 0
        page = (tmp_path / "report" / "index.html").read_text()
        spend = page[page.index('id="search-spend"') :].split("</p>")[0]
        assert "paid calls <b>3</b>" in spend and "cost <b>0.045</b>" in spend
        assert "kept on disk by earlier runs: 3)" in spend  # the resume's three queries

        # --no-cache asks the service again
        fresh = tmp_path / "fresh"
        assert run_cli("train", "--config", config, "--run-dir", fresh, "--no-cache").code == 0
        assert len(server.records) == 2 * paid_first
    stored = b"".join(f.read_bytes() for f in _search_answer_store.rglob("*") if f.is_file())
    assert b"prince author" in stored and not any(k.encode() in stored for k in KEYS)
