"""QA sets: loading every layout we accept, and deterministic iteration for training.

Who calls what:

- the train loop calls :func:`load_questions` on ``config.data.train`` once at start-up, wraps
  the questions in a :class:`QuestionStream` seeded with ``config.run.seed``, takes
  ``next_batch(rollout.questions_per_batch)`` once per step, and stores ``stream.state()`` in
  every checkpoint (``load_state`` on resume), so a resumed run sees exactly the questions the
  uninterrupted run would have seen;
- ``searchr1 eval`` calls :func:`load_questions` on ``--data`` / ``config.data.eval`` and
  :func:`limit_per_source` for a fixed subset;
- ``searchr1 data check FILE`` prints :meth:`LoadedQuestions.summary`.

Accepted row layouts (JSONL, one object per line, a JSON array, or parquet):

- Search-R1 flat: ``{"id", "question", "golden_answers": [...], "data_source"}``;
- Search-R1 nested (the verl parquet files the original trains on):
  ``{"data_source", "prompt": [{"role": "user", "content": "...Question: q\\n"}],
  "reward_model": {"ground_truth": {"target": [...]}}, "extra_info": {"index": 3}}``
  (the flat columns win when both are present, as in the published files);
- plain: ``{"question", "answers": [...]}`` (or ``"answer": "..."``).

A row that cannot be read is skipped and reported as a :class:`MalformedRow` (row number and
reason); it never stops the load.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.builtins import is_builtin, resolve
from searchr1.core.errors import UserError
from searchr1.core.types import Question

#: keys that may carry the golden answers, in order of preference
_ANSWER_KEYS = ("golden_answers", "answers", "answer", "golden_answer", "target")
#: every column :func:`_question_from_row` may read
_COLUMNS = frozenset(
    {"id", "question", "data_source", "prompt", "reward_model", "extra_info", *_ANSWER_KEYS}
)
#: how many malformed rows an error message quotes before "... and N more"
_QUOTED_PROBLEMS = 5


class DataError(UserError):
    """A QA file that cannot be used at all (missing, unreadable, no valid row)."""


@dataclass(frozen=True)
class MalformedRow:
    """A skipped row: its 1-based number (the line number in a JSONL file, the row index in
    a parquet file or JSON array) and a reason a person can act on."""

    row: int
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.reason}"


@dataclass(frozen=True)
class LoadedQuestions:
    """The valid questions of one file, in file order, and the rows that were skipped."""

    path: str
    questions: tuple[Question, ...]
    malformed: tuple[MalformedRow, ...] = ()
    total_rows: int = 0

    def __len__(self) -> int:
        return len(self.questions)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.questions)

    def per_source(self) -> dict[str, int]:
        """Valid questions per ``data_source`` (``""`` when the file has none), sorted."""
        return dict(sorted(Counter(q.data_source for q in self.questions).items()))

    def summary(self) -> str:
        """The multi-line text ``searchr1 data check`` prints."""
        lines = [
            f"{self.path}: {self.total_rows} rows, {len(self.questions)} valid, "
            f"{len(self.malformed)} malformed"
        ]
        sources = self.per_source()
        if sources:
            lines.append("per data_source:")
            width = max(len(s or "(none)") for s in sources)
            lines += [f"  {s or '(none)':<{width}}  {n}" for s, n in sources.items()]
        if self.malformed:
            lines.append("malformed rows (skipped):")
            lines += [f"  {m}" for m in self.malformed]
        return "\n".join(lines)


# --------------------------------------------------------------------------- loading


def load_questions(
    path: str, *, field_name: str | None = None, allow_empty: bool = False, report: bool = False
) -> LoadedQuestions:
    """Read a QA file (``builtin:...`` allowed) into questions with stable ids.

    ``field_name`` (e.g. ``"data.train"``) is named in the error when the file is missing, so
    the user knows which config value to fix. With ``allow_empty=False`` a file without a
    single valid row raises :class:`DataError` quoting the first reasons; ``data check``
    passes True to report instead. With ``report`` (train and eval) skipped rows are shown on
    stderr and logged (:func:`report_malformed`), so they never go unnoticed.
    """
    where = f"{field_name} = {path!r}" if field_name else repr(path)
    if not path:
        raise DataError(f"{field_name or 'data file'}: no QA file given (set it in [data])")
    try:
        real = resolve(path) if is_builtin(path) else path
    except FileNotFoundError as exc:
        raise DataError(f"{where}: {exc}") from exc
    p = Path(real)
    if not p.is_file():
        raise DataError(f"{where}: file not found ({p.resolve()})")

    rows = _read_rows(p, where)
    questions: list[Question] = []
    malformed: list[MalformedRow] = []
    seen_ids: Counter[str] = Counter()
    total = 0
    for number, row in rows:
        total += 1
        if isinstance(row, MalformedRow):
            malformed.append(row)
            continue
        try:
            q = _question_from_row(row, number)
        except _RowError as exc:
            malformed.append(MalformedRow(number, str(exc)))
            continue
        # Ids must be unique (trajectory dumps and eval records are keyed by them) and stable
        # (a resumed run or a rerun eval names the same question the same way).
        seen_ids[q.id] += 1
        if seen_ids[q.id] > 1:
            q = _with_id(q, f"{q.id}#{seen_ids[q.id]}")
        questions.append(q)

    loaded = LoadedQuestions(str(p), tuple(questions), tuple(malformed), total)
    if report and malformed:
        report_malformed(loaded, where)
    if not questions and not allow_empty:
        detail = "; ".join(str(m) for m in malformed[:_QUOTED_PROBLEMS])
        more = len(malformed) - _QUOTED_PROBLEMS
        detail += f"; ... and {more} more" if more > 0 else ""
        raise DataError(
            f"{where}: no valid question in {total} rows"
            + (f" ({detail})" if detail else "")
            + "; run `searchr1 data check FILE` for the full list"
        )
    return loaded


def report_malformed(loaded: LoadedQuestions, where: str) -> None:
    """One console line (stderr) and one ``data_malformed_rows`` log event for the rows a
    load skipped: how many, the first few row numbers with their reasons, and the command
    that lists them all."""
    from searchr1.core.logs import get_logger

    bad = loaded.malformed
    quoted = "; ".join(str(m) for m in bad[:_QUOTED_PROBLEMS])
    more = len(bad) - _QUOTED_PROBLEMS
    print(
        f"searchr1: warning: {where}: skipped {len(bad)} malformed rows of "
        f"{loaded.total_rows} ({quoted}{f'; ... and {more} more' if more > 0 else ''}); "
        f"`searchr1 data check {loaded.path}` lists them all",
        file=sys.stderr,
    )
    get_logger().warning(
        "data_malformed_rows",
        data=loaded.path,
        skipped=len(bad),
        rows=loaded.total_rows,
        first=[str(m) for m in bad[:_QUOTED_PROBLEMS]],
    )


def _read_rows(p: Path, where: str) -> Iterable[tuple[int, Any]]:
    """``(row_number, row_or_MalformedRow)`` pairs; whole-file problems raise DataError."""
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq

            # Only the columns a question is built from (published files carry more).
            names = pq.read_schema(p).names
            wanted = [c for c in names if c in _COLUMNS]
            records = pq.read_table(p, columns=wanted).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DataError(f"{where}: not a readable parquet file: {exc}") from exc
        return list(enumerate(records, start=1))
    try:
        text = p.read_text("utf-8-sig")  # a byte-order mark would otherwise spoil row 1
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text (expected JSONL or parquet): {exc}") from exc
    if text.lstrip().startswith("["):  # a JSON array of rows
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON: {exc}") from exc
        return list(enumerate(records, start=1))
    out: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            out.append((number, MalformedRow(number, f"not valid JSON ({exc.msg})")))
    return out


class _RowError(ValueError):
    pass


def _question_from_row(row: Any, number: int) -> Question:
    if not isinstance(row, Mapping):
        raise _RowError(f"expected a JSON object, got {type(row).__name__}")
    text = _question_text(row)
    answers = _golden_answers(row)
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise _RowError(f"'data_source' must be a string, got {type(source).__name__}")
    source = (source or "").strip()
    row_id = row.get("id")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    if row_id is None and extra.get("index") is not None:
        row_id = extra["index"]
    if row_id is not None and not isinstance(row_id, str | int):
        raise _RowError(f"'id' must be a string or integer, got {type(row_id).__name__}")
    if row_id is None or str(row_id).strip() == "":
        # No id in the file: derive one from the content, so it survives reordering.
        digest = hashlib.sha1(json.dumps([text, answers]).encode()).hexdigest()[:12]
        qid = f"q-{digest}"
    else:
        qid = str(row_id).strip()
    # Published test files reuse ids across sources ("test_0" in nq and in hotpotqa).
    if source and not qid.startswith(f"{source}/"):
        qid = f"{source}/{qid}"
    metadata: dict[str, Any] = {"row": number}
    if extra:
        metadata["extra_info"] = dict(extra)
    return Question(
        id=qid,
        question=text,
        golden_answers=tuple(answers),
        data_source=source,
        metadata=metadata,
    )


def _question_text(row: Mapping[str, Any]) -> str:
    text = row.get("question")
    if text is None:
        text = _question_from_prompt(row.get("prompt"))
        if text is None:
            raise _RowError("missing 'question' (and no user message in 'prompt')")
    if not isinstance(text, str):
        raise _RowError(f"'question' must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise _RowError("empty 'question'")
    return text


def _question_from_prompt(prompt: Any) -> str | None:
    """The question inside the original's chat prompt: the last user message, after its
    final ``Question:`` marker (the original prepends instructions to every question)."""
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, Sequence):
        users = [
            m.get("content")
            for m in prompt
            if isinstance(m, Mapping)
            and m.get("role") == "user"
            and isinstance(m.get("content"), str)
        ]
        if not users:
            return None
        content = users[-1]
    else:
        return None
    head, marker, tail = content.rpartition("Question:")
    return (tail if marker else content).strip()


def _golden_answers(row: Mapping[str, Any]) -> list[str]:
    raw: Any = None
    for key in _ANSWER_KEYS:
        if row.get(key) is not None:
            raw = row[key]
            break
    if raw is None:
        reward_model = row.get("reward_model")
        if isinstance(reward_model, Mapping):
            truth = reward_model.get("ground_truth")
            raw = truth.get("target") if isinstance(truth, Mapping) else truth
    if raw is None:
        raise _RowError(
            "no golden answers (expected 'golden_answers', 'answers' or "
            "'reward_model.ground_truth.target')"
        )
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        raw = [raw]
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise _RowError(f"golden answers must be a list of strings, got {type(raw).__name__}")
    answers: list[str] = []
    for item in raw:
        # Numbers appear in some sets (years, counts); an answer is compared as text anyway.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _RowError(f"golden answer {item!r} is not a string")
        value = str(item).strip()
        if value and value not in answers:
            answers.append(value)
    if not answers:
        raise _RowError("golden answers are empty")
    return answers


def _with_id(q: Question, new_id: str) -> Question:
    return Question(new_id, q.question, q.golden_answers, q.data_source, q.metadata)


def limit_per_source(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """The first ``limit`` questions of each ``data_source``, in file order (a fixed subset:
    the public replication evaluated 10 per benchmark). ``None`` keeps everything."""
    if limit is None:
        return list(questions)
    if limit < 1:
        raise ValueError(f"--limit-per-source must be >= 1, got {limit}")
    taken: Counter[str] = Counter()
    out: list[Question] = []
    for q in questions:
        if taken[q.data_source] < limit:
            taken[q.data_source] += 1
            out.append(q)
    return out


# --------------------------------------------------------------------------- iteration


@dataclass
class QuestionStream:
    """Questions in a shuffled order that depends only on ``seed``, epoch after epoch.

    Epoch ``e`` is a permutation drawn from ``random.Random(f"{seed}/{e}")``, whose algorithm
    is stable across Python versions. A batch that crosses the end of an epoch continues
    with the next one. :meth:`state` is a small JSON-able dict for the checkpoint;
    :meth:`load_state` puts the cursor back exactly.
    """

    questions: Sequence[Question] = field(repr=False)
    seed: int = 0
    epoch: int = 0
    cursor: int = 0
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.questions = tuple(self.questions)
        if not self.questions:
            raise ValueError("QuestionStream needs at least one question")
        self._order = self._permutation(self.epoch)

    def __len__(self) -> int:
        return len(self.questions)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.questions)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Question]:
        """The next ``n`` questions (called once per training step)."""
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        batch: list[Question] = []
        while len(batch) < n:
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(batch), len(self._order) - self.cursor)
            batch += [self.questions[i] for i in self._order[self.cursor : self.cursor + take]]
            self.cursor += take
        return batch

    def fingerprint(self) -> str:
        """A short hash of the question ids in file order: detects a changed data file."""
        h = hashlib.sha1()
        for q in self.questions:
            h.update(q.id.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]

    def state(self) -> dict[str, Any]:
        """What a checkpoint records (JSON-able)."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_questions": len(self.questions),
            "fingerprint": self.fingerprint(),
        }

    def load_state(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Restore a cursor saved by :meth:`state`.

        With ``strict`` (the default) a state recorded for a different data file or seed
        raises ``ValueError``: continuing would silently repeat or skip questions."""
        if strict:
            mismatches = [
                f"{key} was {state.get(key)!r}, now {now!r}"
                for key, now in (
                    ("seed", self.seed),
                    ("num_questions", len(self.questions)),
                    ("fingerprint", self.fingerprint()),
                )
                if key in state and state[key] != now
            ]
            if mismatches:
                raise ValueError(
                    "the checkpoint's data cursor does not match this data: "
                    + "; ".join(mismatches)
                    + " (same data file and run.seed needed to resume)"
                )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= len(self.questions):
            raise ValueError(f"invalid data cursor: epoch={epoch}, cursor={cursor}")
        self.epoch, self.cursor = epoch, cursor
        self._order = self._permutation(epoch)
