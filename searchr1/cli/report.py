"""``searchr1 report RUN_DIR``: write the run's HTML report and PNG charts.

Needs no config and no plugins: everything comes from the run folder.
"""

from __future__ import annotations

import argparse

from searchr1.core.errors import UserError


def cmd_report(args: argparse.Namespace) -> int:
    from searchr1.report import build_report

    try:
        files = build_report(args.run_dir, args.out, pngs=not args.no_png)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    except (FileExistsError, NotADirectoryError) as exc:  # the output folder cannot be made
        flag = f"--out {args.out}" if args.out else f"{args.run_dir}/report (the default --out)"
        raise UserError(
            f"{flag}: cannot make the report folder there ({exc.strerror}: {exc.filename}); "
            "give --out a folder path: a missing folder is made, a file is never replaced"
        ) from exc
    print(f"report: {files.html}")
    for png in files.pngs:
        print(f"chart:  {png}")
    if files.skipped_lines:
        n = files.skipped_lines
        print(
            f"skipped {n} unreadable line{'s' if n != 1 else ''} in {args.run_dir} (a line cut "
            f"short by a crash or a full disk)"
        )
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="HTML report (and PNG charts) of a run folder")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (holds events.jsonl)")
    p.add_argument("--out", help="output folder (default: RUN_DIR/report)")
    p.add_argument("--no-png", action="store_true", help="only the HTML page")
    p.set_defaults(func=cmd_report)
