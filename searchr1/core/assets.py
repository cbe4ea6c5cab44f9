"""``builtin:NAME[/FILE]`` assets, registered by plugins (``register_assets``), so the core
never names one. Built once, deterministically, into ``$SEARCHR1_CACHE`` (default
``~/.cache/searchr1``) via a temporary folder renamed into place: never half-built."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from searchr1.core.disk import as_disk_error, make_temp_dir, match_umask
from searchr1.core.plugins import load_registry
from searchr1.core.types import Asset

PREFIX = "builtin:"


def cache_dir() -> Path:
    return Path(os.environ.get("SEARCHR1_CACHE", Path.home() / ".cache" / "searchr1"))


def is_builtin(spec: str) -> bool:
    return spec.startswith(PREFIX)


def asset_name(spec: str) -> str:
    """``"world"`` for ``"builtin:world/train.jsonl"``."""
    return spec[len(PREFIX) :].partition("/")[0]


def resolve(spec: str, assets: Mapping[str, Asset] | None = None) -> str:
    """A real path for ``spec``: unchanged unless ``builtin:``. ``assets`` (the run
    registry's) defaults to those the installed plugins register."""
    if not is_builtin(spec):
        return spec
    name, _, rest = spec[len(PREFIX) :].partition("/")
    assets = load_registry().assets if assets is None else assets
    if name not in assets:
        known = ", ".join(sorted(assets)) or "(none)"
        raise FileNotFoundError(f"unknown built-in asset {spec!r}; known: {known}")
    asset = assets[name]
    folder = cache_dir() / f"{name}-{asset.version}"
    if not (folder / ".complete").exists():
        build(folder, asset)
    path = folder / rest if rest else folder
    if not path.exists():
        raise FileNotFoundError(f"{spec!r}: built-in asset {name!r} has no file {rest!r}")
    return str(path)


def build(folder: Path, asset: Asset) -> None:
    """Build ``asset`` into ``folder``; a write the disk refuses raises an ``OSError`` naming
    ``folder`` (not the temporary one, which is removed)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(folder.parent, f".{folder.name}-")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(folder)) from None
    try:
        asset.build(tmp)
        (tmp / ".complete").write_text("ok\n")
        match_umask(tmp)  # a shared cache: readable as the umask allows
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / ".complete").exists():  # a concurrent build won; otherwise retry
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
    except Exception as exc:  # a library may wrap the disk's refusal (safetensors, torch)
        refused = as_disk_error(exc)
        if refused is None:
            raise
        inside = refused.filename is None or str(refused.filename).startswith(str(tmp))
        where = str(folder) if inside else refused.filename  # the temporary name means nothing
        raise OSError(refused.errno, refused.strerror, where) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
