"""``searchr1 data check FILE``: what a QA file holds before a run depends on it.

Prints rows, per-source counts and every malformed row (row number and reason); exits 1
when the file has no valid row, 2 when it cannot be read at all.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.data import LoadedQuestions


def cmd_data_check(args: argparse.Namespace) -> int:
    from searchr1.core.data import load_questions

    loaded = load_questions(args.file, allow_empty=True)
    print(summary(loaded))
    if not loaded.questions:
        print(f"{args.file}: no valid question", flush=True)
        return 1
    return 0


def summary(loaded: LoadedQuestions) -> str:
    """What :func:`cmd_data_check` prints: counts, questions per ``data_source`` and every
    malformed row with its reason."""
    lines = [
        f"{loaded.path}: {loaded.total_rows} rows, {len(loaded.questions)} valid, "
        f"{len(loaded.malformed)} malformed"
    ]
    sources = loaded.per_source()
    if sources:
        lines.append("per data_source:")
        width = max(len(s or "(none)") for s in sources)
        lines += [f"  {s or '(none)':<{width}}  {n}" for s, n in sources.items()]
    if loaded.malformed:
        lines.append("malformed rows (skipped):")
        lines += [f"  {m}" for m in loaded.malformed]
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="QA data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser(
        "check", help="count rows and sources of a QA file and list its malformed rows"
    )
    c.add_argument(
        "file",
        help="QA file: .jsonl, .json or .parquet (builtin:... allowed)",
    )
    c.set_defaults(func=cmd_data_check)
