"""QA sets: loading a file of questions. The data format registered for the file's suffix
(hook ``register_data_formats``) turns it into numbered rows; this module keeps the loop: a
row that cannot be read is skipped as a :class:`MalformedRow`, never stopping the load, ids
are made unique, and a file without a valid row is an error.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.builtins import is_builtin, resolve
from searchr1.core.errors import UserError
from searchr1.core.plugins import installed_registry
from searchr1.core.types import DataFormat, Question

#: how many malformed rows an error message quotes before "... and N more"
_QUOTED_PROBLEMS = 5


class DataError(UserError):
    """A QA file that cannot be used at all (missing, unreadable, no valid row)."""


@dataclass(frozen=True)
class MalformedRow:
    """A skipped row: its 1-based number (as its data format counts rows) and the reason."""

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


def load_questions(
    path: str,
    *,
    field_name: str | None = None,
    allow_empty: bool = False,
    report: bool = False,
    formats: Mapping[str, DataFormat] | None = None,
) -> LoadedQuestions:
    """Read a QA file (``builtin:...`` allowed) into questions with stable ids.

    ``field_name`` (e.g. ``"data.train"``) is named in errors. Unless ``allow_empty``, a file
    without a valid row raises DataError quoting the first reasons. ``report`` shows and logs
    skipped rows (:func:`report_malformed`) so they never go unnoticed. ``formats`` (suffix ->
    format) defaults to the installed plugins' data formats.
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

    fmt = _format_for(p, where, installed_registry().data_formats if formats is None else formats)
    questions: list[Question] = []
    malformed: list[MalformedRow] = []
    seen_ids: Counter[str] = Counter()
    total = 0
    try:
        # Rows are consumed as they come: a format may yield them lazily, and only fail (a
        # corrupt file) part-way through; that is still a whole-file problem.
        for number, q in fmt.read(p):
            total += 1
            if not isinstance(q, Question):
                malformed.append(MalformedRow(number, str(q)))
                continue
            # Unique (dumps and eval records are keyed by id) and stable across reruns.
            seen_ids[q.id] += 1
            if seen_ids[q.id] > 1:
                q = _with_id(q, f"{q.id}#{seen_ids[q.id]}")
            questions.append(q)
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from exc

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


def _format_for(p: Path, where: str, formats: Mapping[str, DataFormat]) -> DataFormat:
    """The format registered for ``p``'s suffix; an unclaimed suffix is an error listing the
    registered ones (guessing a layout would turn a wrong file into a pile of bad rows)."""
    fmt = formats.get(p.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(formats)) or "(none installed)"
        what = f"{p.suffix!r} files" if p.suffix else "files without a suffix"
        raise DataError(
            f"{where}: no data format reads {what}; registered suffixes: {known} "
            "(a plugin adds one with the register_data_formats hook)"
        )
    return fmt


def _with_id(q: Question, new_id: str) -> Question:
    return Question(new_id, q.question, q.golden_answers, q.data_source, q.metadata)
