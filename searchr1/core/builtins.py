"""``builtin:NAME[/FILE]`` assets: the tiny models, the offline world and its files.

Config values such as ``base_model = "builtin:tiny"`` or ``train = "builtin:world/train.jsonl"``
are resolved here, by whoever opens them (the local model provider, the local search
provider, the data loader). Which names exist is up to the plugins: each registers its assets
through the ``register_assets`` hook (:class:`searchr1.core.types.Asset`: a version and a
builder), so the core never names a plugin. An asset is built once, deterministically, into
the cache folder (``$SEARCHR1_CACHE``, default ``~/.cache/searchr1``) and reused; a build
writes to a temporary folder and renames it into place, so a crash mid-build never leaves a
half-built asset.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from searchr1.core.gguf import convert_gguf, gguf_cache_name, is_gguf
from searchr1.core.plugins import load_registry
from searchr1.core.types import Asset, Sampler

PREFIX = "builtin:"

#: The assets the installed plugins register, collected on first use (see :func:`known_assets`).
_known: dict[str, Asset] | None = None


def known_assets() -> Mapping[str, Asset]:
    """Every asset the loaded plugins register, by name; collected once per process through
    :func:`searchr1.core.plugins.load_registry`, on the first ``builtin:`` path resolved."""
    global _known
    if _known is None:
        _known = dict(load_registry().assets)
    return _known


def cache_dir() -> Path:
    return Path(os.environ.get("SEARCHR1_CACHE", Path.home() / ".cache" / "searchr1"))


def is_builtin(spec: str) -> bool:
    return spec.startswith(PREFIX)


def asset_name(spec: str) -> str:
    """``"world"`` for ``"builtin:world/train.jsonl"``."""
    return spec[len(PREFIX) :].partition("/")[0]


def resolve(spec: str, assets: Mapping[str, Asset] | None = None) -> str:
    """A real path for ``spec``: unchanged unless it starts with ``builtin:`` or names a
    ``.gguf`` file (converted once into the cache, :mod:`searchr1.core.gguf`). ``assets``
    (default: :func:`known_assets`) says which names exist."""
    if is_gguf(spec) and not is_builtin(spec):
        return _converted_gguf(Path(spec).expanduser())
    if not is_builtin(spec):
        return spec
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


def _converted_gguf(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    folder = cache_dir() / gguf_cache_name(path)
    if not (folder / ".complete").exists():
        from searchr1.core.logs import get_logger

        get_logger().info("gguf.converting", file=str(path), folder=str(folder))
        _build(folder, Asset("1", lambda tmp: convert_gguf(path, tmp)))
    return str(folder)


def ceiling_agent(
    config: Any, tokenizer: Any, protocol: Any, spec: str | None = None
) -> Sampler | None:
    """The scripted stand-in sampler that plays the questions of ``spec`` (default
    ``data.eval``) perfectly, when that file is a ``builtin:`` asset whose plugin offers one
    (:attr:`Asset.ceiling`), else None. Called by ``searchr1 train`` once, before the first
    step, and by the cold start (:mod:`searchr1.core.cold_start`) as its teacher."""
    spec = str(config.data.eval if spec is None else spec or "")
    if not is_builtin(spec):
        return None
    asset = known_assets().get(asset_name(spec))
    if asset is None or asset.ceiling is None:
        return None
    return asset.ceiling(config, tokenizer, protocol)


def _build(folder: Path, asset: Asset) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        asset.build(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / ".complete").exists():  # a concurrent build won; otherwise retry
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
