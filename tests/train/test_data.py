"""QA loading (every accepted layout, malformed rows) and deterministic iteration."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.cli.eval import limit_per_source
from searchr1.core.data import DataError, load_questions
from searchr1.core.plugins import load_registry
from searchr1.core.question_stream import QuestionStream
from searchr1.core.types import Question

PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. Question: "
)


def _nested_row(i: int, source: str, question: str, answers: list[str]) -> dict:
    """A row as the original's verl parquet files hold it (no flat columns)."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"{PREFIX}{question}\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "test", "index": i},
    }


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_flat_search_r1_jsonl(tmp_path: Path) -> None:
    f = _write_jsonl(
        tmp_path / "test.jsonl",
        [
            {
                "id": "test_0",
                "question": "who wrote x?",
                "golden_answers": ["Ann"],
                "data_source": "nq",
            },
            {
                "id": "test_0",
                "question": "where is y?",
                "golden_answers": ["Oslo", "oslo city"],
                "data_source": "hotpotqa",
            },
        ],
    )
    loaded = load_questions(str(f), {})
    assert [q.id for q in loaded.questions] == ["nq/test_0", "hotpotqa/test_0"]
    assert loaded.questions[1].golden_answers == ("Oslo", "oslo city")
    assert loaded.per_source() == {"hotpotqa": 1, "nq": 1}
    assert loaded.malformed == ()


def test_nested_parquet_layout(tmp_path: Path) -> None:
    rows = [_nested_row(i, "nq", f"question number {i}?", [f"ans{i}", "alt"]) for i in range(3)]
    f = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), f)
    loaded = load_questions(str(f), {})
    assert len(loaded.questions) == 3
    q = loaded.questions[2]
    assert q.question == "question number 2?"  # the instruction prefix is stripped
    assert q.golden_answers == ("ans2", "alt")
    assert q.data_source == "nq" and q.id == "nq/2"


def test_published_parquet_with_both_layouts_prefers_flat_columns(tmp_path: Path) -> None:
    row = _nested_row(7, "triviaqa", "ignored prompt question", ["x"])
    row.update(id="test_7", question="Real question?", golden_answers=["Real", "answer"])
    f = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([row]), f)
    (q,) = load_questions(str(f), {}).questions
    assert (q.id, q.question, q.golden_answers) == (
        "triviaqa/test_7",
        "Real question?",
        ("Real", "answer"),
    )


def test_plain_jsonl_and_stable_content_ids(tmp_path: Path) -> None:
    rows = [{"question": "q1?", "answers": ["a1"]}, {"question": "q2?", "answer": "a2"}]
    a = load_questions(str(_write_jsonl(tmp_path / "a.jsonl", rows)), {})
    b = load_questions(str(_write_jsonl(tmp_path / "b.jsonl", rows[::-1])), {})
    # ids derive from content, so reordering the file does not rename questions
    assert {q.id: q.question for q in a.questions} == {q.id: q.question for q in b.questions}
    assert a.questions[1].golden_answers == ("a2",)
    assert a.questions[0].data_source == ""


def test_malformed_rows_are_skipped_with_row_numbers(tmp_path: Path) -> None:
    f = _write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"question": "good?", "answers": ["yes"]},
            "{not json",
            {"question": "no answers"},
            "",
            {"question": "  ", "answers": ["x"]},
            [1, 2],
            {"question": "bad answer type", "answers": [{"a": 1}]},
            {"question": "empty answers", "answers": ["", " "]},
            {"question": "number answer", "answers": [1851]},
        ],
    )
    loaded = load_questions(str(f), {})
    assert [q.question for q in loaded.questions] == ["good?", "number answer"]
    assert loaded.questions[1].golden_answers == ("1851",)
    reasons = {m.row: m.reason for m in loaded.malformed}
    assert sorted(reasons) == [2, 3, 5, 6, 7, 8]  # line 4 is blank, not a row
    assert "not valid JSON" in reasons[2]
    assert "no golden answers" in reasons[3]
    assert "empty 'question'" in reasons[5]
    assert "JSON object" in reasons[6]
    assert "not a string" in reasons[7]
    assert "empty" in reasons[8]
    assert loaded.total_rows == 8


def test_duplicate_ids_get_a_suffix(tmp_path: Path) -> None:
    rows = [{"id": 1, "question": f"q{i}?", "answers": ["a"]} for i in range(3)]
    loaded = load_questions(str(_write_jsonl(tmp_path / "d.jsonl", rows)), {})
    assert [q.id for q in loaded.questions] == ["1", "1#2", "1#3"]


def test_missing_file_names_the_config_field(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.train = .*nope\.jsonl.*file not found"):
        load_questions(str(tmp_path / "nope.jsonl"), {}, field_name="data.train")
    unknown = r"data\.eval = .*: unknown built-in asset .*; known: .*tiny-random, world"
    with pytest.raises(DataError, match=unknown):  # the run's assets, named
        load_questions(
            "builtin:no-such-asset/x.jsonl", load_registry().assets, field_name="data.eval"
        )


def test_an_unknown_suffix_or_an_unreadable_file_names_the_config_field(tmp_path: Path) -> None:
    notes = _write_jsonl(tmp_path / "questions.txt", [{"question": "q?", "answers": ["a"]}])
    with pytest.raises(
        DataError, match=r"data\.train = .*'\.txt' files.*\.json, \.jsonl, \.parquet"
    ):
        load_questions(str(notes), {}, field_name="data.train")
    broken = tmp_path / "questions.PARQUET"  # suffixes fold case
    broken.write_text("not parquet")
    with pytest.raises(
        DataError, match=r"data\.eval = .*questions\.PARQUET.*not a readable parquet"
    ):
        load_questions(str(broken), {}, field_name="data.eval")


def test_no_valid_rows_raises_unless_allowed(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "empty.jsonl", [{"q": 1}, "oops"])
    with pytest.raises(DataError, match=r"no valid question in 2 rows.*row 1"):
        load_questions(str(f), {})
    assert len(load_questions(str(f), {}, allow_empty=True).malformed) == 2


def test_limit_per_source_keeps_file_order() -> None:
    qs = [Question(f"{s}{i}", "q", ("a",), s) for i in range(5) for s in ("nq", "hotpot")]
    picked = limit_per_source(qs, 2)
    assert [q.id for q in picked] == ["nq0", "hotpot0", "nq1", "hotpot1"]
    assert limit_per_source(qs, None) == qs


# --------------------------------------------------------------------------- stream


def _questions(n: int) -> list[Question]:
    return [Question(f"id{i}", f"q{i}", ("a",)) for i in range(n)]


def test_stream_is_deterministic_and_covers_each_epoch() -> None:
    qs = _questions(10)
    a, b = QuestionStream(qs, seed=3), QuestionStream(qs, seed=3)
    first = [q.id for _ in range(5) for q in a.next_batch(4)]  # 20 = two epochs
    assert first == [q.id for _ in range(5) for q in b.next_batch(4)]
    assert sorted(first[:10]) == sorted(q.id for q in qs)
    assert sorted(first[10:]) == sorted(q.id for q in qs)
    assert first[:10] != first[10:]  # each epoch is reshuffled
    other = [q.id for q in QuestionStream(qs, seed=4).next_batch(10)]
    assert other != first[:10]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    batch=st.integers(1, 7),
    before=st.integers(0, 6),
    after=st.integers(1, 6),
)
def test_state_restores_the_exact_cursor(n: int, batch: int, before: int, after: int) -> None:
    qs = _questions(n)
    straight = QuestionStream(qs, seed=1)
    for _ in range(before):
        straight.next_batch(batch)
    saved = json.loads(json.dumps(straight.state()))  # as a checkpoint stores it
    expected = [straight.next_batch(batch) for _ in range(after)]
    resumed = QuestionStream(qs, seed=1)
    resumed.load_state(saved)
    assert [resumed.next_batch(batch) for _ in range(after)] == expected


def test_state_from_other_data_is_refused() -> None:
    s = QuestionStream(_questions(5), seed=0)
    s.next_batch(2)
    with pytest.raises(ValueError, match="num_questions was 5, now 6"):
        QuestionStream(_questions(6), seed=0).load_state(s.state())
    with pytest.raises(ValueError, match="seed was 0, now 9"):
        QuestionStream(_questions(5), seed=9).load_state(s.state())


def _mixed(sizes: dict[str, int]) -> list[Question]:
    """Questions of several sources, interleaved in file order."""
    out = [Question(f"{s}{i}", "q", ("a",), s) for s, n in sizes.items() for i in range(n)]
    return sorted(out, key=lambda q: (int(q.id.lstrip("abcdefghijklmnopqrstuvwxyz")), q.id))


def test_several_sources_are_drawn_in_turn_whatever_their_sizes() -> None:
    """A step sees every kind of question: 9 one-hop and 3 two-hop questions still give
    batches of 2 + 2 (an unbalanced shuffle bunches one kind into some steps)."""
    qs = _mixed({"hop1": 9, "hop2": 3})
    stream = QuestionStream(qs, seed=0)
    assert stream.balanced
    batches = [stream.next_batch(4) for _ in range(6)]
    for batch in batches:
        assert sorted(q.data_source for q in batch) == ["hop1", "hop1", "hop2", "hop2"]
    hop2 = [q.id for b in batches for q in b if q.data_source == "hop2"]
    assert sorted(hop2[:3]) == ["hop20", "hop21", "hop22"]  # each source covers its epoch
    assert sorted(hop2[3:6]) == ["hop20", "hop21", "hop22"]
    hop1 = [q.id for b in batches for q in b if q.data_source == "hop1"]
    assert sorted(hop1[:9]) == sorted(q.id for q in qs if q.data_source == "hop1")
    # Odd batch sizes alternate which source gets the extra question.
    three = QuestionStream(_mixed({"a": 5, "b": 5, "c": 5}), seed=1)
    counts = [sorted(q.data_source for q in three.next_batch(2)) for _ in range(3)]
    assert counts == [["a", "b"], ["a", "c"], ["b", "c"]]


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=3),
    batch=st.integers(1, 5),
    before=st.integers(0, 5),
)
def test_a_balanced_cursor_restores_exactly(sizes: list[int], batch: int, before: int) -> None:
    qs = _mixed({f"s{k}": n for k, n in enumerate(sizes)})
    straight = QuestionStream(qs, seed=2)
    for _ in range(before):
        straight.next_batch(batch)
    saved = json.loads(json.dumps(straight.state()))
    expected = [straight.next_batch(batch) for _ in range(3)]
    resumed = QuestionStream(qs, seed=2)
    resumed.load_state(saved)
    assert [resumed.next_batch(batch) for _ in range(3)] == expected


def test_a_cursor_saved_before_balancing_continues_its_own_shuffle() -> None:
    """A checkpoint written by a version that shuffled all sources together resumes with
    the questions that run would have drawn next."""
    qs = _mixed({"hop1": 4, "hop2": 4})
    order = list(range(len(qs)))
    random.Random("5/0").shuffle(order)  # the single shuffle of epoch 0, seed 5
    old_state = {"seed": 5, "epoch": 0, "cursor": 3, "num_questions": 8}
    stream = QuestionStream(qs, seed=5)
    stream.load_state(old_state)
    assert [q.id for q in stream.next_batch(4)] == [qs[i].id for i in order[3:7]]
    with pytest.raises(ValueError, match="sources"):
        QuestionStream(qs, seed=5).load_state({"seed": 5, "drawn": 0, "sources": {"x": [0, 0]}})


# --------------------------------------------------------------------------- CLI


def test_every_training_step_sees_every_source(tmp_path: Path, run_cli, scripted_plugin) -> None:
    """Through ``searchr1 train``: 6 NQ and 2 HotpotQA questions, 2 questions a step: each of
    4 steps trains on one of each (a single shuffle gives some steps two NQ questions), and
    a resumed run continues the same per-source cursors."""
    from train_configs import train_config

    config = train_config(tmp_path, train="dump_trajectories = 4\n")
    rows = [{"question": f"nq {i}?", "answers": ["France"], "data_source": "nq"} for i in range(6)]
    rows += [
        {"question": f"hop {i}?", "answers": ["France"], "data_source": "hotpot"} for i in range(2)
    ]
    _write_jsonl(tmp_path / "train.jsonl", rows)
    run = tmp_path / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    assert (
        run_cli("train", "--config", config, "--run-dir", run, "--resume", "--max-steps", "4").code
        == 0
    )
    for step in range(1, 5):
        dumped = [
            json.loads(x)
            for x in (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        assert sorted({d["data_source"] for d in dumped}) == ["hotpot", "nq"], step


def test_data_check_cli(tmp_path: Path, run_cli) -> None:
    f = _write_jsonl(
        tmp_path / "mix.jsonl",
        [
            {"question": "a?", "golden_answers": ["1"], "data_source": "nq"},
            {"question": "b?", "golden_answers": ["2"], "data_source": "nq"},
            {"question": "c?", "golden_answers": ["3"], "data_source": "popqa"},
            {"question": "d?"},
        ],
    )
    result = run_cli("data", "check", f)
    out = result.out
    assert result.code == 0
    assert "4 rows, 3 valid, 1 malformed" in out
    assert "nq     2" in out and "popqa  1" in out
    assert "row 4: no golden answers" in out

    bad = _write_jsonl(tmp_path / "bad.jsonl", ["nope"])
    assert run_cli("data", "check", bad).code == 1
    missing = run_cli("data", "check", tmp_path / "missing.jsonl")
    assert missing.code == 2 and "file not found" in missing.err
