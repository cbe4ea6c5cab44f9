"""The core modules plugins imported before :mod:`searchr1.sdk`, and the modules that moved:
they keep working for a plugin, which gets one :class:`OldPluginImportWarning` per old module it
imports, naming the new import. The ``searchr1`` package and this checkout's bench/, scripts/ and tests/ import them
without a warning."""

from __future__ import annotations

import dis
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any


class OldPluginImportWarning(DeprecationWarning):
    """A module outside searchr1 imported a name from a core module instead of searchr1.sdk."""


# Shown once per importing module even where DeprecationWarnings are hidden (the default outside
# __main__): a plugin author must see it. ``-W`` / PYTHONWARNINGS given by the user win.
if not sys.warnoptions:
    warnings.filterwarnings("default", category=OldPluginImportWarning)

# The bytecode of an import statement or an attribute read (``from m import X``, ``m.X``,
# ``from m import *``): a name read by the machinery (pickle, typing, inspect) is no plugin import.
_IMPORT_OPS = frozenset(
    dis.opmap[op]
    for op in ("IMPORT_FROM", "IMPORT_STAR", "LOAD_ATTR", "LOAD_METHOD", "CALL_INTRINSIC_1")
    if op in dis.opmap
)
_warned: set[tuple[str, str]] = set()
#: the names searchr1.sdk offers, told by the SDK as it loads (:func:`offer`); the core imports
#: no SDK, and the built-in plugins (which import it) load before any other plugin
_offered: set[str] = set()
#: modules that moved, left as re-exports at their old path: old module -> new module
_moved: dict[str, str] = {}
#: names the SDK offers under another name: (old module, old name) -> the SDK's name
_RENAMED = {("searchr1.core.assets", "resolve"): "resolve_asset"}
_lock = threading.Lock()
#: this checkout's own tools, which read the core as the package does (not plugins): bench/,
#: scripts/ and tests/ beside the package folder (absent from an installed wheel)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FIRST_PARTY = tuple(os.path.join(_CHECKOUT, d) + os.sep for d in ("bench", "scripts", "tests"))


class _PluginFacingModule(ModuleType):
    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name.startswith("_"):
            return value
        frame = sys._getframe(1)
        importer = frame.f_globals.get("__name__") or ""
        if importer == "searchr1" or importer.startswith("searchr1."):
            return value
        if frame.f_code.co_filename.startswith(_FIRST_PARTY):
            return value
        if frame.f_code.co_code[frame.f_lasti] in _IMPORT_OPS:
            _warn(super().__getattribute__("__name__"), name, importer)
        return value


def _warn(old: str, name: str, importer: str) -> None:
    with _lock:
        if (old, importer) in _warned:
            return
        _warned.add((old, importer))
    name = _RENAMED.get((old, name), name)
    if old in _moved:
        new = f"it moved to {_moved[old]} (from {_moved[old]} import {name})"
    elif name in _offered:
        new = f"import from searchr1.sdk instead (from searchr1.sdk import {name})"
    elif not _offered:
        new = "import from searchr1.sdk instead (its __all__ lists what a plugin may import)"
    else:
        new = f"{name} is internal to searchr1 (not in searchr1.sdk) and may change without notice"
    warnings.warn(
        f"{importer}: importing {old} is deprecated for plugins; {new}",
        OldPluginImportWarning,
        stacklevel=3,
    )


def offer(names: list[str]) -> None:
    """The names searchr1.sdk offers (it calls this once, as it loads)."""
    _offered.update(names)


def warn_plugins(module_name: str) -> None:
    """Make the module ``module_name`` warn a plugin that imports from it (call at its end)."""
    sys.modules[module_name].__class__ = _PluginFacingModule


def moved_module(module_name: str, new: str) -> None:
    """Make ``module_name``, the re-export left where a module was before it moved to ``new``,
    warn a plugin that imports from it, naming ``new`` (call at its end)."""
    _moved[module_name] = new
    warn_plugins(module_name)
