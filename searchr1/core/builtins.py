"""``builtin:NAME[/FILE]`` assets, registered by plugins (``register_assets``), so the core
never names one. Built once, deterministically, into ``$SEARCHR1_CACHE`` (default
``~/.cache/searchr1``) via a temporary folder renamed into place: never half-built."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from hashlib import sha256
from pathlib import Path

from searchr1.core.disk import as_disk_error
from searchr1.core.plugins import installed_registry
from searchr1.core.types import Asset, FileFormat

PREFIX = "builtin:"


def known_assets() -> Mapping[str, Asset]:
    """Every asset the installed plugins register, by name."""
    return installed_registry().assets


def cache_dir() -> Path:
    return Path(os.environ.get("SEARCHR1_CACHE", Path.home() / ".cache" / "searchr1"))


def is_builtin(spec: str) -> bool:
    return spec.startswith(PREFIX)


def asset_name(spec: str) -> str:
    """``"world"`` for ``"builtin:world/train.jsonl"``."""
    return spec[len(PREFIX) :].partition("/")[0]


def resolve(spec: str, assets: Mapping[str, Asset] | None = None) -> str:
    """A real path for ``spec``: unchanged unless ``builtin:`` or a registered file
    format's suffix (converted once into the cache)."""
    if not is_builtin(spec):
        fmt = installed_registry().file_formats.get(Path(spec).suffix.lower())
        return _converted(Path(spec).expanduser(), fmt) if fmt is not None else spec
    name, _, rest = spec[len(PREFIX) :].partition("/")
    assets = known_assets() if assets is None else assets
    if name not in assets:
        known = ", ".join(sorted(assets)) or "(none)"
        raise FileNotFoundError(f"unknown built-in asset {spec!r}; known: {known}")
    asset = assets[name]
    folder = cache_dir() / f"{name}-{asset.version}"
    if not (folder / ".complete").exists():
        _build(folder, asset)
    path = folder / rest if rest else folder
    if not path.exists():
        raise FileNotFoundError(f"{spec!r}: built-in asset {name!r} has no file {rest!r}")
    return str(path)


def _converted(path: Path, fmt: FileFormat) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path.suffix} file {str(path)!r} does not exist")
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{fmt.version}"
    # stem and a hash of path, size and mtime: an edited or replaced file is converted again
    folder = cache_dir() / f"{path.suffix[1:]}-{path.stem}-{sha256(key.encode()).hexdigest()[:12]}"
    if not (folder / ".complete").exists():
        from searchr1.core.logs import get_logger

        get_logger().info("file_format.converting", file=str(path), folder=str(folder))
        _build(folder, Asset(fmt.version, lambda tmp: fmt.convert(path, tmp)))
    return str(folder)


def _build(folder: Path, asset: Asset) -> None:
    """Build ``asset`` into ``folder``; a write the disk refuses raises an ``OSError`` naming
    ``folder`` (not the temporary one, which is removed)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(folder)) from None
    try:
        asset.build(tmp)
        (tmp / ".complete").write_text("ok\n")
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
