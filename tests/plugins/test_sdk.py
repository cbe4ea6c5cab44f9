"""The plugin SDK's promises: plugins import from searchr1 only ``searchr1.sdk``, ``searchr1.kit``
and their own package; no private name crosses a package; a plugin written against the imports
documented before the SDK still loads and passes ``smoke``, warned once per old module it
imports; a plugin written against the SDK is warned of nothing."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from smoke_configs import scripted

import searchr1.sdk

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "searchr1"
PLUGIN_MODULES = Path(__file__).parent / "plugin_modules"


def _modules(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _imports(tree: ast.AST):
    """(line, module, name or None) of every absolute import of searchr1, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "searchr1":
                for alias in node.names:
                    yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "searchr1":
                    yield node.lineno, alias.name, None


def _plugin_package(path: Path) -> str:
    """``local_model`` for searchr1/plugins/local_model/x.py, ``chatml`` for plugins/chatml.py."""
    return path.relative_to(PACKAGE / "plugins").with_suffix("").parts[0]


def test_plugins_import_only_the_sdk_the_kit_and_their_own_package() -> None:
    wrong = []
    for path, tree in _modules(PACKAGE / "plugins"):
        own = _plugin_package(path)
        for line, module, name in _imports(tree):
            full = f"{module}.{name}" if name else module
            parts = full.split(".")
            if module == "searchr1.sdk" or parts[1] == "kit":
                continue
            if parts[1] == "plugins" and len(parts) > 2 and parts[2] == own:
                continue
            if module == "searchr1.plugins" and name == own:
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {full}")
    assert not wrong, "plugins import searchr1.sdk, searchr1.kit or their own package:\n" + (
        "\n".join(wrong)
    )


#: modules that moved out of a built-in plugin into the kit, so another plugin may use them
MOVED = {
    **{
        f"searchr1.plugins.local_model.{m}": f"searchr1.kit.learner.{m}"
        for m in (
            "learner", "sharded_learner", "chunked_logprobs", "llds", "reference",
            "shared_prefix", "state", "fsdp", "lora_coverage", "device", "kernels", "budget",
        )
    },
    **{
        f"searchr1.plugins.agent_protocols.{m}": f"searchr1.kit.protocols.{m}"
        for m in ("call_formats", "thinking", "tags", "tool_calls")
    },
    "searchr1.plugins.chatml": "searchr1.kit.chatml",
}  # fmt: skip


def test_modules_moved_to_the_kit_keep_their_old_import_paths() -> None:
    """A plugin importing a moved module by its old path gets the same objects, and the local
    provider's module still offers the loading it used to define."""
    for old, new in MOVED.items():
        before, after = importlib.import_module(old), importlib.import_module(new)
        public = [n for n in vars(after) if not n.startswith("_")]
        assert public and all(getattr(before, n) is getattr(after, n) for n in public), old
    provider = importlib.import_module("searchr1.plugins.local_model.provider")
    loading = importlib.import_module("searchr1.kit.learner.loading")
    for name in ("LocalSettings", "load_lora_model", "make_learner", "attach_lora"):
        assert getattr(provider, name) is getattr(loading, name)
    old_requests = importlib.import_module("searchr1.plugins.local_model.sample_request")
    requests = importlib.import_module("searchr1.kit.learner.requests")
    assert old_requests.check_request is requests.check_request


def _package_of(module: str) -> str:
    """The package a module belongs to for the private-name rule: searchr1.core, searchr1.kit,
    searchr1.cli, searchr1.report, searchr1.plugins.<plugin>, or searchr1 itself."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "plugins":
        return ".".join(parts[:3])
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return "searchr1"


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_across_packages() -> None:
    wrong = []
    for path, tree in _modules(PACKAGE):
        here = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mine = _package_of(here)
        aliases: dict[str, str] = {}  # a local name bound to another package's module
        for line, module, name in _imports(tree):
            full = f"{module}.{name}" if name else module
            if _package_of(full if name and _is_module(full) else module) != mine:
                if any(_private(part) for part in full.split(".")[1:]):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {full}")
                if name and _is_module(full):
                    aliases[name] = full
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                wrong.append(
                    f"{path.relative_to(ROOT)}:{node.lineno}: reads "
                    f"{aliases[node.value.id]}.{node.attr}"
                )
    assert not wrong, "private names used across packages:\n" + "\n".join(wrong)


def test_the_sdk_names_are_all_present_and_documented() -> None:
    """Every name ``__all__`` promises exists, and docs/plugins.md imports only from the SDK
    (and the kit)."""
    missing = [name for name in searchr1.sdk.__all__ if not hasattr(searchr1.sdk, name)]
    assert not missing
    docs = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    old = sorted(set(re.findall(r"from (searchr1\.core\.\w+) import", docs)))
    assert not old, f"docs/plugins.md still shows imports of {old}"
    assert "from searchr1.sdk import" in docs


CONFIG = """\
[rollout]
protocol = "tags"
max_trajectory_tokens = 512
[train]
max_datum_tokens = 512
[search]
provider = "legacy_echo"
[search.legacy_echo]
prefix = "old: "
[reward]
terms = ["short_answer"]
[data]
train = "builtin:quiz/quiz.jsonl"
"""
TURNS = [
    ["<search> little prince author </search>", "<answer> France </answer>"],
    ["<search> Saint-Exupéry </search>", "<answer> Paris </answer>"],
    ["<search> Le Petit Prince </search>", "<answer> France </answer>"],
    ["<search> b </search>", "Lyon, I think"],
]


def test_a_plugin_on_the_old_imports_passes_smoke_warned_once_per_old_module(
    tmp_path: Path,
) -> None:
    """``searchr1 smoke`` through the CLI, in a fresh process with default warning filters, with
    two development plugins: one on the imports documented before the SDK (five core modules,
    a protocol module that moved to the kit, and the kit), one on ``searchr1.sdk``. Smoke
    passes through both; each old module is named once with its new import; the SDK plugin, the kit and this checkout's own test helpers
    (which import the core) are named in no warning."""
    config = tmp_path / "config.toml"
    config.write_text(f"{scripted(TURNS)}\n{CONFIG}", encoding="utf-8")
    plugins = tmp_path / "plugins"  # outside this checkout, as a plugin author's folder is
    plugins.mkdir()
    for module in PLUGIN_MODULES.glob("searchr1_*.py"):
        shutil.copy(module, plugins / module.name)
    helpers = ROOT / "tests" / "helpers"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(helpers), str(plugins)]),
        "SEARCHR1_PLUGINS": "searchr1_legacy,searchr1_modern,scripted_plugin",
        "SEARCHR1_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "smoke", "--config", str(config),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "smoke: PASS" in out.stderr
    assert (
        "old: little prince author" in (tmp_path / "run" / "smoke_trajectories.jsonl").read_text()
    )
    warned = re.findall(
        r"OldPluginImportWarning: searchr1_legacy: importing (searchr1\.\S+) is deprecated for "
        r"plugins; import from searchr1\.sdk instead \(from searchr1\.sdk import (\w+)\)",
        out.stderr,
    )
    assert sorted(warned) == [
        ("searchr1.core.config_schema", "setting"),
        ("searchr1.core.config_validate", "plugin_settings"),
        ("searchr1.core.errors", "UserError"),
        ("searchr1.core.hookspecs", "Register"),
        ("searchr1.core.types", "SearchFactory"),
    ], out.stderr
    assert (
        "OldPluginImportWarning: searchr1_legacy: importing "
        "searchr1.plugins.agent_protocols.call_formats is deprecated for plugins; it moved to "
        "searchr1.kit.protocols.call_formats (from searchr1.kit.protocols.call_formats import "
        "detect_call_format)" in out.stderr
    ), out.stderr
    assert "searchr1_modern" not in out.stderr
    # the scripted model's modules (tests/helpers, this checkout's own) read the core unwarned
    lines = [line for line in out.stderr.splitlines() if "OldPluginImportWarning" in line]
    assert len(lines) == 6 and all(": searchr1_legacy: " in line for line in lines), lines


def test_the_old_import_of_a_name_outside_the_sdk_says_it_is_internal(tmp_path: Path) -> None:
    """A plugin reaching for a core name the SDK does not offer is told the name is internal,
    one the SDK renamed gets its new name, and an old module read through its attribute
    (``answers.exact_match``) is warned once, at the first read, and works."""
    (tmp_path / "reaches_in.py").write_text(
        "from searchr1.core.disk import describe_refusal\n"
        "from searchr1.core.assets import resolve\n"
        "import searchr1.core.answers as answers\n"
        "print(answers.exact_match('Paris', ['paris']), answers.f1_score('Paris', ['paris']))\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("PYTHONWARNINGS", None)
    env["SEARCHR1_PLUGINS"] = "reaches_in"  # a development plugin, loaded by `searchr1 plugins`
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "plugins"], capture_output=True, text=True,
        env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True 1.0\n")
    lines = [line for line in out.stderr.splitlines() if "OldPluginImportWarning" in line]
    assert lines == [
        f"{tmp_path / 'reaches_in.py'}:1: OldPluginImportWarning: reaches_in: importing "
        "searchr1.core.disk is deprecated for plugins; describe_refusal is internal to searchr1 "
        "(not in searchr1.sdk) and may change without notice",
        f"{tmp_path / 'reaches_in.py'}:2: OldPluginImportWarning: reaches_in: importing "
        "searchr1.core.assets is deprecated for plugins; import from searchr1.sdk instead "
        "(from searchr1.sdk import resolve_asset)",
        f"{tmp_path / 'reaches_in.py'}:4: OldPluginImportWarning: reaches_in: importing "
        "searchr1.core.answers is deprecated for plugins; import from searchr1.sdk instead "
        "(from searchr1.sdk import exact_match)",
    ]
