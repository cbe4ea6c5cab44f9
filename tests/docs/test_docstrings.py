"""Module docstrings say what the module is, in at most 10 lines: rationale, measurements and
the settings' meaning live once in docs/ (a docstring that retells a page drifts from it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "searchr1"
MAX_LINES = 10


def test_every_module_docstring_is_at_most_ten_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            lines = body[0].end_lineno - body[0].lineno + 1
            if isinstance(body[0].value.value, str) and lines > MAX_LINES:
                long.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
    assert not long, f"module docstrings over {MAX_LINES} lines:\n" + "\n".join(long)
