"""The layering a newcomer relies on: the core names no plugin (not even in a string), every
docstring's reference lives in this repository, and the offline world has no import cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "searchr1"


def test_core_never_names_a_plugin_or_the_world() -> None:
    # The same pattern as `grep -rn "searchr1.plugins\|searchr1.world" searchr1/core/`.
    pattern = re.compile(r"searchr1.plugins|searchr1.world")
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((PACKAGE / "core").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "the core reaches into a plugin:\n" + "\n".join(hits)


def test_references_point_into_the_repository() -> None:
    pattern = re.compile(r"shared/reference|seed's error|(?<![\w/])protocols\.md")
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in (PACKAGE, ROOT / "tests")
        for path in sorted(folder.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and path != Path(__file__)
    ]
    assert not hits, "a reference a reader of this repo cannot open: " + ", ".join(hits)
    assert (ROOT / "docs" / "protocols.md").is_file()


def _import_graph() -> dict[str, set[str]]:
    """Module -> the searchr1 modules it imports anywhere (lazy imports in functions too)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                candidates = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            deps.update(c for c in candidates if c in modules and c != name)
        graph[name] = deps
    return graph


def test_the_offline_world_has_no_import_cycle() -> None:
    graph = _import_graph()
    world = sorted(m for m in graph if m.startswith("searchr1.plugins.offline_world"))
    assert "searchr1.plugins.offline_world.assets" in world
    for start in world:  # depth-first from each world module: does any path come back?
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            assert module != start, f"{start} imports itself through {sorted(seen)}"
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
