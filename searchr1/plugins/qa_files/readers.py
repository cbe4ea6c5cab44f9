"""The built-in QA file readers, each a :class:`~searchr1.core.types.DataFormat` ``read``:
a file becomes ``(row_number, Question or reason)`` pairs, every row through
:func:`~searchr1.plugins.qa_files.rows.question_from_row`. A file that cannot be read at all
raises ValueError; :func:`searchr1.core.data.load_questions` names the config field in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from searchr1.core.types import DataRow
from searchr1.plugins.qa_files.rows import COLUMNS, RowError, question_from_row


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
        import pyarrow.parquet as pq  # imported here: the hook must stay cheap

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
