"""QA sets: loading a file of questions. The reader of the file's suffix turns it into
numbered rows (``.jsonl`` and ``.json``: JSONL or a JSON array, either suffix reads both;
``.parquet``: the Search-R1 / verl parquet files); a row that cannot be read is skipped as a
:class:`MalformedRow`, never stopping the load, ids are made unique, and a file without a
valid row is an error.

A row is Search-R1's flat or nested (verl parquet) layout, or a plain
``{"question", "answers"}`` (:func:`question_from_row`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from searchr1.core.assets import is_builtin, resolve
from searchr1.core.errors import UserError
from searchr1.core.types import Asset, Question

#: how many malformed rows an error message quotes before "... and N more"
_QUOTED_PROBLEMS = 5


class DataError(UserError):
    """A QA file that cannot be used at all (missing, unreadable, no valid row)."""


@dataclass(frozen=True)
class MalformedRow:
    """A skipped row: its 1-based number (as its reader counts rows) and the reason."""

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

    def per_source(self) -> dict[str, int]:
        """Valid questions per ``data_source`` (``""`` when the file has none), sorted."""
        return dict(sorted(Counter(q.data_source for q in self.questions).items()))


def load_questions(
    path: str,
    assets: Mapping[str, Asset],
    *,
    field_name: str | None = None,
    allow_empty: bool = False,
    report: bool = False,
) -> LoadedQuestions:
    """Read a QA file (a ``builtin:`` one of ``assets``, the run's) into questions with
    stable ids.

    ``field_name`` (e.g. ``"data.train"``) is named in errors. Unless ``allow_empty``, a file
    without a valid row raises DataError quoting the first reasons. ``report`` shows and logs
    skipped rows (:func:`report_malformed`) so they never go unnoticed.
    """
    where = f"{field_name} = {path!r}" if field_name else repr(path)
    if not path:
        raise DataError(f"{field_name or 'data file'}: no QA file given (set it in [data])")
    try:
        real = resolve(path, assets) if is_builtin(path) else path
    except FileNotFoundError as exc:
        raise DataError(f"{where}: {exc}") from exc
    p = Path(real)
    if not p.is_file():
        raise DataError(f"{where}: file not found ({p.resolve()})")
    loaded = _read_questions(p, where)
    if report and loaded.malformed:
        report_malformed(loaded, where)
    if not loaded.questions and not allow_empty:
        malformed = loaded.malformed
        detail = "; ".join(str(m) for m in malformed[:_QUOTED_PROBLEMS])
        more = len(malformed) - _QUOTED_PROBLEMS
        detail += f"; ... and {more} more" if more > 0 else ""
        raise DataError(
            f"{where}: no valid question in {loaded.total_rows} rows"
            + (f" ({detail})" if detail else "")
            + "; run `searchr1 data check FILE` for the full list"
        )
    return loaded


def _read_questions(p: Path, where: str) -> LoadedQuestions:
    """Every row of the file: the valid ones as questions (a repeated id numbered ``#2``,
    ``#3``, ...), the others as malformed rows with their reason."""
    read = _reader_for(p, where)
    questions: list[Question] = []
    malformed: list[MalformedRow] = []
    seen_ids: Counter[str] = Counter()
    total = 0
    try:
        for number, q in read(p):
            total += 1
            if not isinstance(q, Question):
                malformed.append(MalformedRow(number, str(q)))
                continue
            # Unique (dumps and eval records are keyed by id) and stable across reruns.
            seen_ids[q.id] += 1
            if seen_ids[q.id] > 1:
                q = replace(q, id=f"{q.id}#{seen_ids[q.id]}")
            questions.append(q)
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from exc
    return LoadedQuestions(str(p), tuple(questions), tuple(malformed), total)


def report_malformed(loaded: LoadedQuestions, where: str) -> None:
    """One stderr line and one ``data_malformed_rows`` event: how many rows were skipped,
    the first few with reasons, and the command that lists them all."""
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


def _reader_for(p: Path, where: str) -> Callable[[Path], list[DataRow]]:
    """The reader of ``p``'s suffix; another suffix is an error listing the known ones
    (guessing a layout would turn a wrong file into a pile of bad rows)."""
    read = READERS.get(p.suffix.lower())
    if read is None:
        what = f"{p.suffix!r} files" if p.suffix else "files without a suffix"
        raise DataError(
            f"{where}: no data format reads {what}; registered suffixes: "
            f"{', '.join(sorted(READERS))}"
        )
    return read


# --------------------------------------------------------------------------- readers

#: one numbered row of a QA file: the question it holds, or why it holds none
DataRow = tuple[int, Question | str]


def read_json_rows(path: Path) -> list[DataRow]:
    """A JSON array of rows (numbered from 1) or JSONL (numbered by line; blank lines are no
    row). Either suffix reads both: the first character decides, as people mix them up."""
    try:
        text = path.read_text("utf-8-sig")  # a byte-order mark would otherwise spoil row 1
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (expected JSONL or parquet): {exc}") from exc
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from exc
        return [_row(number, record) for number, record in enumerate(records, start=1)]
    rows: list[DataRow] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:  # one bad line costs that row, not the file
            rows.append((number, f"not valid JSON ({exc.msg})"))
            continue
        rows.append(_row(number, record))
    return rows


def read_parquet_rows(path: Path) -> list[DataRow]:
    """A parquet table, one row per record (numbered from 1), read for the columns a
    question is built from only: published files carry more, some of them large."""
    try:
        import pyarrow.parquet as pq  # imported here: most runs read JSONL

        wanted = [c for c in pq.read_schema(path).names if c in COLUMNS]
        records = pq.read_table(path, columns=wanted).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ValueError(f"not a readable parquet file: {exc}") from exc
    return [_row(number, record) for number, record in enumerate(records, start=1)]


def _row(number: int, record: Any) -> DataRow:
    """The question in ``record``, or the reason it holds none."""
    try:
        return number, question_from_row(record, number)
    except RowError as exc:
        return number, str(exc)


READERS: dict[str, Callable[[Path], list[DataRow]]] = {
    ".jsonl": read_json_rows,
    ".json": read_json_rows,
    ".parquet": read_parquet_rows,
}


# --------------------------------------------------------------------------- rows

#: keys that may carry the golden answers, in order of preference
_ANSWER_KEYS = ("golden_answers", "answers", "answer", "golden_answer", "target")
#: every column :func:`question_from_row` may read (a parquet file is read for these only)
COLUMNS = frozenset(
    {"id", "question", "data_source", "prompt", "reward_model", "extra_info", *_ANSWER_KEYS}
)


class RowError(ValueError):
    """A row that cannot become a question; the message says why."""


def question_from_row(row: Any, number: int) -> Question:
    """The question in ``row`` (row ``number``, 1-based, is kept in its metadata)."""
    if not isinstance(row, Mapping):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    text = _question_text(row)
    answers = _golden_answers(row)
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise RowError(f"'data_source' must be a string, got {type(source).__name__}")
    source = (source or "").strip()
    row_id = row.get("id")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    if row_id is None and extra.get("index") is not None:
        row_id = extra["index"]
    if row_id is not None and not isinstance(row_id, str | int):
        raise RowError(f"'id' must be a string or integer, got {type(row_id).__name__}")
    if row_id is None or str(row_id).strip() == "":
        digest = hashlib.sha1(json.dumps([text, answers]).encode()).hexdigest()[:12]
        qid = f"q-{digest}"
    else:
        qid = str(row_id).strip()
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
            raise RowError("missing 'question' (and no user message in 'prompt')")
    if not isinstance(text, str):
        raise RowError(f"'question' must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise RowError("empty 'question'")
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
        raise RowError(
            "no golden answers (expected 'golden_answers', 'answers' or "
            "'reward_model.ground_truth.target')"
        )
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        raw = [raw]
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise RowError(f"golden answers must be a list of strings, got {type(raw).__name__}")
    answers: list[str] = []
    for item in raw:
        # Numbers appear in some sets (years, counts); an answer is compared as text anyway.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise RowError(f"golden answer {item!r} is not a string")
        value = str(item).strip()
        if value and value not in answers:
            answers.append(value)
    if not answers:
        raise RowError("golden answers are empty")
    return answers
