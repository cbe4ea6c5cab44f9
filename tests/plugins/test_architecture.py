"""The layering a newcomer relies on, read from the import graph: the core imports no plugin,
plugin kit, CLI or report; plugins and their kit never import the CLI; the Python API imports
no plugin; only a command or the API loads the plugins' registry. The core names no built-in
plugin (not even in a string), every docstring's reference lives in this repository, and no
module imports itself back through others (no import cycle anywhere in ``searchr1``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "searchr1"

#: what the algorithm package (searchr1.rl) knows nothing of: the run around it (its folder,
#: events, sinks, checkpoints, resume, evals, the train loop and what it records), config
#: parsing, the plugin registry, the commands, the plugins and their kit
RL_FORBIDDEN = (
    "searchr1.core.runs", "searchr1.core.logs", "searchr1.core.sinks",
    "searchr1.core.checkpoint", "searchr1.core.resume", "searchr1.core.train",
    "searchr1.core.step", "searchr1.core.cold_start", "searchr1.core.evaluation",
    "searchr1.core.config", "searchr1.core.config_validate", "searchr1.core.plugins",
    "searchr1.core.disk", "searchr1.cli", "searchr1.plugins", "searchr1.kit",
    "searchr1.report", "searchr1.api", "searchr1.sdk",
)  # fmt: skip

#: module prefix -> the packages it must not import (lazy imports and TYPE_CHECKING included)
LAYER_RULES = {
    "searchr1.rl": RL_FORBIDDEN,
    "searchr1.core": ("searchr1.plugins", "searchr1.kit", "searchr1.cli", "searchr1.report"),
    "searchr1.plugins": ("searchr1.cli",),
    "searchr1.kit": ("searchr1.plugins", "searchr1.cli"),
    "searchr1.api": ("searchr1.plugins",),
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} -> {dep}"
        for layer, forbidden in LAYER_RULES.items()
        for name, deps in sorted(graph.items())
        if _within(name, layer)
        for dep in sorted(deps)
        if any(_within(dep, f) for f in forbidden)
    ]


def test_layer_rules_catch_a_forbidden_import() -> None:
    graph = {
        "searchr1.core.train": {"searchr1.core.types", "searchr1.kit.http"},
        "searchr1.plugins.x": {"searchr1.core.types", "searchr1.cli.eval"},
        "searchr1.api": {"searchr1.plugins.zhihu_search"},
        "searchr1.cli.main": {"searchr1.plugins.x", "searchr1.core.train"},
        "searchr1.kitchen": {"searchr1.cli.main"},  # a prefix that is not the kit package
        "searchr1.rl.step": {"searchr1.core.config_schema", "searchr1.core.runs"},
    }
    assert _layer_violations(graph) == [
        "searchr1.rl.step -> searchr1.core.runs",
        "searchr1.core.train -> searchr1.kit.http",
        "searchr1.plugins.x -> searchr1.cli.eval",
        "searchr1.api -> searchr1.plugins.zhihu_search",
    ]


#: the algorithm package's size: read top to bottom in one sitting
RL_MAX_LINES = 1200


def test_the_algorithm_package_is_read_in_one_sitting() -> None:
    lines = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "rl").glob("*.py")}
    assert {"rollout.py", "advantages.py", "datums.py", "batching.py", "step.py"} <= set(lines)
    assert sum(lines.values()) <= RL_MAX_LINES, lines


def test_every_module_imports_only_what_its_layer_allows() -> None:
    graph = _import_graph()
    assert "searchr1.api" in graph and "searchr1.cli.eval" in graph
    violations = _layer_violations(graph)
    assert not violations, "imports across a layer boundary:\n" + "\n".join(violations)


#: every built-in plugin's entry-point and registered names that are not also ordinary words
#: of the core's own vocabulary (rewards, losses, metric sinks, agent protocols, local)
BUILTIN_NAMES = (
    "taotoken", "tinker", "pytrio", "vllm", "zhihu", "local_model", "local_search",
    "openai_chat", "search_r1", "offline_world", "real_models", "smollm", "gguf", "chatml",
    "wandb", "swanlab", "tensorboard", "bm25", "format_answer", "importance_sampling",
    "cross_entropy", "ideal_agent", "qa_files",
)  # fmt: skip

#: registered names that are also ordinary words ("tags" is an agent protocol's name and a
#: protocol's attribute): the core may use the word, never the name as a whole string
BUILTIN_WORDS = ("tags", "tool_calls", "dense", "ppo", "cispo")


def _core_lines() -> list[tuple[str, int, str]]:
    return [
        (str(path.relative_to(ROOT)), n, line)
        for part in ("core", "rl")  # the algorithm is the core's too
        for path in sorted((PACKAGE / part).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
    ]


def test_core_names_no_builtin_plugin_even_in_a_string() -> None:
    """`grep -rni <name> searchr1/core` finds nothing for any built-in plugin, and no string
    in the core is a built-in plugin's registered name: the core works with whatever plugins
    are installed, and says so in its docstrings too."""
    pattern = re.compile("|".join(BUILTIN_NAMES), re.IGNORECASE)
    hits = [
        f"{where}:{n}: {line.strip()}" for where, n, line in _core_lines() if pattern.search(line)
    ]
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in BUILTIN_WORDS:
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    words = re.compile("|".join(f"``{w}``" for w in BUILTIN_WORDS))
    hits += [
        f"{where}:{n}: {line.strip()}" for where, n, line in _core_lines() if words.search(line)
    ]
    assert not hits, "the core names a built-in plugin:\n" + "\n".join(hits)


def test_the_registry_is_loaded_only_at_a_command_or_api_entry() -> None:
    """Only the commands and the Python API call ``load_registry``; everything else is given
    the run's registry, or its config (whose ``assets`` every ``builtin:`` path resolves
    against), so one run never sees two sets of plugins."""
    allowed = (PACKAGE / "api.py", PACKAGE / "cli")
    calls = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(path == a or a in path.parents for a in allowed)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "load_registry"
    ]
    assert not calls, "load_registry() outside a command or the API:\n" + "\n".join(calls)


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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm, iterative so a deep chain cannot hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_anywhere_in_the_package() -> None:
    """No module of ``searchr1`` imports itself back through others, lazy imports and
    ``TYPE_CHECKING`` blocks included. ``from pkg import submodule`` counts as importing
    ``pkg`` (its ``__init__``), so a package's modules import each other by full path."""
    graph = _import_graph()
    cycles = _cycles(graph)
    described = [
        " <-> ".join(c) + "\n  " + "\n  ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c)
        for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


#: the most functions that may take the whole run object; all of them entry points of the
#: runtime or a command (issue 60): the rest are handed the parts they read
RUN_TAKERS_MAX = 8
#: where a function taking the whole run may live
RUN_TAKERS_WHERE = ("searchr1/core/train.py", "searchr1/core/runs.py", "searchr1/cli/")


def _run_takers(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line name`` (``path`` under ``root``) of each function with a parameter annotated ``Run`` or ``Run | None``
    (quoted, dotted or not)."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                note = ast.unparse(arg.annotation).strip("'\"") if arg.annotation else ""
                kinds = {part.strip().rsplit(".", 1)[-1] for part in note.split("|")}
                if "Run" in kinds and kinds <= {"Run", "None", "Optional[Run]"}:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
                    break
    return found


def test_the_run_taker_count_sees_every_spelling(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "def a(run: Run): ...\nasync def b(x, *, run: 'Run | None'): ...\n"
        "def c(run: runs.Run) -> None: ...\ndef d(run: Runner, env: Env): ...\n"
    )
    found = [line.split(" ", 1)[1] for line in _run_takers([source], tmp_path)]
    assert found == ["a", "b", "c"]


def test_few_functions_take_the_run() -> None:
    """The algorithm, the evals, the checkpoints and the records take the parts they read
    (environment, job, trainer, config, folder, sinks); only the entry points take a whole
    :class:`~searchr1.core.runs.Run`, so each part can be read and tested without one."""
    takers = _run_takers(sorted(PACKAGE.rglob("*.py")))
    listing = "\n".join(takers)
    assert len(takers) <= RUN_TAKERS_MAX, f"{len(takers)} functions take the Run:\n{listing}"
    elsewhere = [t for t in takers if not t.startswith(RUN_TAKERS_WHERE)]
    assert not elsewhere, "a Run taken outside the runtime and the commands:\n" + listing
