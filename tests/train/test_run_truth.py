"""What a run says of itself is what happened: a judge that dies mid-run stops training (exit 3)
and the report opens with that stop, its judge failures and fallbacks counted; ``--resume``
then carries the judge's run totals across both processes into ``train_done``; a held-out eval
inside ``train`` that searched through a dead search service is flagged as ``searchr1 eval``
flags it. Real loopback servers (the fake judge, the fake retriever), a real stop, a real
resume."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from cli_run import make_config, read_events
from fake_judge_server import KEYS, FakeJudgeServer
from search_fakes import Behaviour, start_fake_retriever


def _down_after_first_checkpoint(run: Path, server: FakeJudgeServer, done: threading.Event) -> None:
    """Take the judge down once the run logged its first checkpoint (step 1 is kept)."""
    events = run / "events.jsonl"
    while not done.is_set():
        if events.is_file() and '"event": "checkpoint"' in events.read_text(errors="replace"):
            server.down = True
            return
        time.sleep(0.005)


def test_a_judge_dying_mid_run_is_in_the_report_and_resume_keeps_run_totals(
    tmp_path: Path, config_file, run_cli, monkeypatch
) -> None:
    monkeypatch.setenv("JUDGE_KEYS", KEYS[0])
    run = tmp_path / "run"
    with FakeJudgeServer() as server:
        judge = {
            "api_base": server.base_url,
            "api_key": "${JUDGE_KEYS}",
            "model": "judge-model",
            "timeout_s": 5.0,
            "max_retries": 0,
            "disk_cache": False,  # every verdict paid: the totals count calls, not cache hits
        }
        text = make_config(
            rollout={"questions_per_batch": 2, "group_size": 3},
            train={
                "max_steps": 2,
                "save_every": 1,
                "guard_max_waits": 1,
                "guard_backoff_seconds": 0.01,
            },
            reward={"name": "judge", "judge": judge},
        )
        config = config_file(text)
        done = threading.Event()
        watcher = threading.Thread(
            target=_down_after_first_checkpoint, args=(run, server, done), daemon=True
        )
        watcher.start()
        try:
            stopped = run_cli("train", "--config", config, "--run-dir", run)
        finally:
            done.set()
            watcher.join()
        assert stopped.code == 3, (stopped.out + stopped.err)[-3000:]
        assert [m["step"] for m in read_events(run, "metrics")] == [1]
        failures = read_events(run, "judge_failures")
        assert len(failures) == 2  # step 2 and its one retry, none trained
        report = run_cli("report", run, "--no-png")
        assert report.code == 0, report.err
        page = (run / "report" / "index.html").read_text()
        end = page[page.index('id="run-end"') : page.index('<h2 id="health">')]
        assert "training stopped early (exit 3)" in end and "the reward judge" in end
        failed = sum(e["failed"] for e in failures)
        fallbacks = sum(e["without_verdict"] for e in failures)
        assert failed > 0 and fallbacks >= failed
        assert f"failed calls {failed}, answers scored by the fallback {fallbacks}" in page

        server.down = False
        resumed = run_cli("train", "--config", config, "--run-dir", run, "--resume")
        assert resumed.code == 0, (resumed.out + resumed.err)[-3000:]
    (done_event,) = read_events(run, "train_done")
    # every call the judge answered, in both processes (the two checks included); the calls
    # that failed after the checkpoint were never answered, so never counted in requests
    assert done_event["judge/calls_total"] == len(server.requests)
    assert (
        done_event["judge/calls_total"]
        > sum(m["judge/calls"] for m in read_events(run, "metrics") if m["step"] == 2) + 1
    )  # more than the resumed process alone sent
    assert run_cli("report", run, "--no-png").code == 0
    page = (run / "report" / "index.html").read_text()
    assert '<p id="run-end">finished: 2 steps</p>' in page
    assert f"calls <b>{int(done_event['judge/calls_total'])}</b>" in page


def test_a_heldout_eval_inside_train_on_dead_search_is_flagged(
    tmp_path: Path, config_file, run_cli
) -> None:
    heldout = tmp_path / "heldout.jsonl"
    rows = [
        {"question": "Who founded Nungen Guild?", "golden_answers": ["Vazil Nesfir"]},
        {"question": "Who founded Sistan Group?", "golden_answers": ["x"]},
    ]
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    with start_fake_retriever(Behaviour(all_status=503)) as (base, _):
        search = {
            "provider": "search_r1",
            "api_base": base,
            "local": None,
            "cache": False,
            "max_retries": 0,
        }
        text = make_config(
            search=search,
            train={
                "max_steps": 1,
                "eval_before_after": True,
                "guard_max_waits": 0,
                "guard_backoff_seconds": 0.01,
            },
            data={"eval": str(heldout)},
        )
        result = run_cli("train", "--config", config_file(text), "--run-dir", run)
    assert result.code == 3, (result.out + result.err)[-3000:]  # the guard, at step 1
    (before,) = read_events(run, "eval/heldout_em")
    assert before["trustworthy"] is False and before["search_success_rate"] < 0.9
    (flag,) = read_events(run, "heldout_untrusted")
    assert flag["when"] == "before" and "NOT trustworthy" in flag["message"]
    assert run_cli("report", run, "--no-png").code == 0
    page = (run / "report" / "index.html").read_text()
    assert "(untrusted: search failed)" in page


#: what two runs of one seed may log differently: measurements of the machine, the run's name
_TIMINGS = ("time/", "search/latency", "pipeline/", "throughput", "memory/", "run_id")


def _step_numbers(run: Path) -> list[dict]:
    return [
        {k: v for k, v in m.items() if not k.startswith(_TIMINGS) and k != "timestamp"}
        for m in read_events(run, "metrics")
    ]


def test_one_seed_repeats_the_run_exactly(tmp_path: Path, config_file, run_cli) -> None:
    """Two runs of one seed at the default settings log the same numbers, bit for bit: the
    rollout advances its trajectories a turn at a time together (``rollout.lockstep``), so
    what shares a sampler batch does not follow when each search returns, and the local
    provider takes torch's ordered CPU kernels, so a step's gradients do not follow thread
    timing (docs/training.md, "Same seed, same run?")."""
    text = make_config(
        rollout={
            "questions_per_batch": 3,
            "group_size": 3,
            "max_search_calls": 2,
            "dynamic_sampling": True,
            "max_extra_draws": 2,
        },
        train={"max_steps": 3, "save_every": 100},
        model={"temperature": 0.7},
    )
    config = config_file(text)
    runs = []
    for name in ("first", "second"):
        result = run_cli("train", "--config", config, "--run-dir", tmp_path / name)
        assert result.code == 0, (result.out + result.err)[-3000:]
        runs.append(_step_numbers(tmp_path / name))
    assert len(runs[0]) == 3
    for first, second in zip(*runs, strict=True):
        differ = {
            k: (first.get(k), second.get(k))
            for k in first | second
            if first.get(k) != second.get(k)
        }
        assert not differ, (first["step"], differ)
