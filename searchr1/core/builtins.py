"""``builtin:NAME[/FILE]`` assets: the tiny model, the offline world and its files.

Config values such as ``base_model = "builtin:tiny"`` or ``train = "builtin:world/train.jsonl"``
are resolved here, by whoever opens them (the local model provider, the local search
provider, the data loader). An asset is built once, deterministically, into the cache folder
(``$SEARCHR1_CACHE``, default ``~/.cache/searchr1``) and reused; a build writes to a temporary
folder and renames it into place, so a crash mid-build never leaves a half-built asset.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "builtin:"

#: asset name -> (version, "module:function" that builds it into an empty folder)
#: Bump the version whenever the builder's output changes, so stale caches are rebuilt.
ASSETS: dict[str, tuple[str, str]] = {}


def register_asset(name: str, version: str, builder: str) -> None:
    ASSETS[name] = (version, builder)


def cache_dir() -> Path:
    return Path(os.environ.get("SEARCHR1_CACHE", Path.home() / ".cache" / "searchr1"))


def is_builtin(spec: str) -> bool:
    return spec.startswith(PREFIX)


def resolve(spec: str) -> str:
    """A real path for ``spec``: unchanged unless it starts with ``builtin:``."""
    if not is_builtin(spec):
        return spec
    name, _, rest = spec[len(PREFIX) :].partition("/")
    _load_known_assets()
    if name not in ASSETS:
        known = ", ".join(sorted(ASSETS)) or "(none)"
        raise FileNotFoundError(f"unknown built-in asset {spec!r}; known: {known}")
    version, builder = ASSETS[name]
    folder = cache_dir() / f"{name}-{version}"
    if not (folder / ".complete").exists():
        _build(folder, builder)
    path = folder / rest if rest else folder
    if not path.exists():
        raise FileNotFoundError(f"{spec!r}: built-in asset {name!r} has no file {rest!r}")
    return str(path)


def _build(folder: Path, builder: str) -> None:
    module_name, _, func_name = builder.partition(":")
    build = getattr(importlib.import_module(module_name), func_name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        build(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / ".complete").exists():  # a concurrent build won; otherwise retry
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_known_assets() -> None:
    """Import the modules that register built-in assets (kept lazy: torch is heavy)."""
    for module in ("searchr1.plugins.local_model.tiny_model", "searchr1.world.assets"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise
