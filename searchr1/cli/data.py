"""``searchr1 data check FILE``: what a QA file holds before a run depends on it.

Prints rows, per-source counts and every malformed row (row number and reason); exits 1
when the file has no valid row, 2 when it cannot be read at all.
"""

from __future__ import annotations

import argparse


def cmd_data_check(args: argparse.Namespace) -> int:
    from searchr1.core.data import load_questions

    loaded = load_questions(args.file, allow_empty=True)
    print(loaded.summary())
    if not loaded.questions:
        print(f"{args.file}: no valid question", flush=True)
        return 1
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="QA data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser(
        "check", help="count rows and sources of a QA file and list its malformed rows"
    )
    c.add_argument("file", help="JSONL, JSON or parquet QA file (builtin:... allowed)")
    c.set_defaults(func=cmd_data_check)
