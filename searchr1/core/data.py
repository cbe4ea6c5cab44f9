"""QA sets: loading a file of questions (JSONL, JSON array or parquet), and a fixed subset
for evaluation. Rows are read by :func:`searchr1.core.data_rows.question_from_row`; one that
cannot be read is skipped as a :class:`MalformedRow`, never stopping the load.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.builtins import is_builtin, resolve
from searchr1.core.data_rows import COLUMNS, RowError, question_from_row
from searchr1.core.errors import UserError
from searchr1.core.types import Question

#: how many malformed rows an error message quotes before "... and N more"
_QUOTED_PROBLEMS = 5


class DataError(UserError):
    """A QA file that cannot be used at all (missing, unreadable, no valid row)."""


@dataclass(frozen=True)
class MalformedRow:
    """A skipped row: 1-based number (JSONL line, or parquet/array index) and reason."""

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


def load_questions(
    path: str, *, field_name: str | None = None, allow_empty: bool = False, report: bool = False
) -> LoadedQuestions:
    """Read a QA file (``builtin:...`` allowed) into questions with stable ids.

    ``field_name`` (e.g. ``"data.train"``) is named in errors. Unless ``allow_empty``, a file
    without a valid row raises DataError quoting the first reasons. ``report`` shows and logs
    skipped rows (:func:`report_malformed`) so they never go unnoticed.
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
            q = question_from_row(row, number)
        except RowError as exc:
            malformed.append(MalformedRow(number, str(exc)))
            continue
        # Unique (dumps and eval records are keyed by id) and stable across reruns.
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


def _read_rows(p: Path, where: str) -> Iterable[tuple[int, Any]]:
    """``(row_number, row_or_MalformedRow)`` pairs; whole-file problems raise DataError."""
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq

            # Only the columns a question is built from (published files carry more).
            names = pq.read_schema(p).names
            wanted = [c for c in names if c in COLUMNS]
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


def _with_id(q: Question, new_id: str) -> Question:
    return Question(new_id, q.question, q.golden_answers, q.data_source, q.metadata)


def limit_per_source(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """The first ``limit`` questions of each ``data_source``, in file order (the public
    replication evaluated 10 per benchmark); ``None`` keeps all."""
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
