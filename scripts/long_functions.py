"""List the functions of a package by length and cyclomatic complexity, read from the AST.

Length is ``end_lineno - lineno + 1`` (decorators excluded, a nested function counted again as
its own). Complexity follows radon's rules (1 + each if, loop, except, boolean operator, branch
of a comprehension or match); a nested function's branches count for it, not its parent.

    python scripts/long_functions.py                # functions over 60 lines
    python scripts/long_functions.py --cc 15        # functions of complexity 15 or more
    python scripts/long_functions.py --package /elsewhere/searchr1   # another checkout's
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Function:
    """One function: where it is (``path:line qualified.name``), its length and complexity."""

    path: str
    line: int
    name: str
    lines: int
    complexity: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


def _complexity(function: FunctionNode) -> int:
    count = 1
    stack: list[ast.AST] = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, FunctionNode | ast.ClassDef | ast.Lambda):
            continue  # counted as its own function (a lambda has no statements to branch on)
        if isinstance(node, ast.If | ast.IfExp | ast.For | ast.AsyncFor | ast.While):
            count += 1
        elif isinstance(node, ast.ExceptHandler | ast.match_case):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        stack.extend(ast.iter_child_nodes(node))
    return count


def functions(package: Path, root: Path | None = None) -> list[Function]:
    """Every function and method under ``package``, nested ones included, in file order;
    paths relative to ``root`` (default: the folder holding ``package``)."""
    root = root or package.parent
    found: list[Function] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        _visit(tree, "", path.relative_to(root).as_posix(), found)
    return found


def _visit(node: ast.AST, prefix: str, path: str, found: list[Function]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, FunctionNode):
            name = prefix + child.name
            lines = child.end_lineno - child.lineno + 1
            found.append(Function(path, child.lineno, name, lines, _complexity(child)))
            _visit(child, name + ".", path, found)
        elif isinstance(child, ast.ClassDef):
            _visit(child, prefix + child.name + ".", path, found)
        else:
            _visit(child, prefix, path, found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, default=ROOT / "searchr1")
    parser.add_argument("--lines", type=int, default=60, help="list functions over this many lines")
    parser.add_argument("--cc", type=int, help="list functions of at least this complexity instead")
    args = parser.parse_args()
    every = functions(args.package.resolve())
    if args.cc is not None:
        chosen = sorted((f for f in every if f.complexity >= args.cc), key=lambda f: -f.complexity)
    else:
        chosen = sorted((f for f in every if f.lines > args.lines), key=lambda f: -f.lines)
    for f in chosen:
        print(f"{f.lines:5d} lines  cc {f.complexity:3d}  {f.where}")
    what = f"of complexity >= {args.cc}" if args.cc is not None else f"over {args.lines} lines"
    print(f"{len(chosen)} of {len(every)} functions {what}")


if __name__ == "__main__":
    main()
