"""``builtin:NAME[/FILE]`` assets, registered by plugins (``register_assets``), so the core
never names one. Built once, deterministically, into ``$SEARCHR1_CACHE`` (default
``~/.cache/searchr1``) via a temporary folder renamed into place: never half-built. Its
``.complete`` marker records every file's size; a folder damaged later (a file gone, cut
short, a header that disagrees with its length: :mod:`searchr1.core.artifacts`) is found the
first time a process uses it, and is discarded and built again with a warning. A build says
what it builds, why and about how long it takes (``asset_building``); processes that need the
same asset meanwhile wait on its lock rather than build it twice. The assets a path resolves against
are the run's registry's, loaded once at the command or API entry and carried by its config
(``Config.assets``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.artifacts import damage, file_sizes
from searchr1.core.disk import as_disk_error, flock_folder, make_temp_dir, match_umask
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import Asset

PREFIX = "builtin:"
COMPLETE = ".complete"
#: folders this process found whole (each is checked once per process)
_whole: set[Path] = set()


@dataclass(frozen=True)
class Built:
    """An asset this process built: ``what`` (``builtin:NAME``, or the file it converts),
    ``why`` it was built, where, and in how many seconds."""

    what: str
    why: str
    folder: Path
    seconds: float


#: every asset this process built, in order (``config check`` says which it built)
built: list[Built] = []


def cache_dir() -> Path:
    return Path(os.environ.get("SEARCHR1_CACHE", Path.home() / ".cache" / "searchr1"))


def is_builtin(spec: str) -> bool:
    return spec.startswith(PREFIX)


def asset_name(spec: str) -> str:
    """``"world"`` for ``"builtin:world/train.jsonl"``."""
    return spec[len(PREFIX) :].partition("/")[0]


def resolve(spec: str, assets: Mapping[str, Asset]) -> str:
    """A real path for ``spec``: unchanged unless ``builtin:``, else the file or folder of
    one of ``assets`` (the run registry's), built first if need be."""
    if not is_builtin(spec):
        return spec
    name, _, rest = spec[len(PREFIX) :].partition("/")
    if name not in assets:
        known = ", ".join(sorted(assets)) or "(none)"
        raise FileNotFoundError(f"unknown built-in asset {spec!r}; known: {known}")
    asset = assets[name]
    folder = cache_dir() / f"{name}-{asset.version}"
    ensure_built(folder, asset, f"{PREFIX}{name}")
    path = folder / rest if rest else folder
    if not path.exists():
        raise FileNotFoundError(f"{spec!r}: built-in asset {name!r} has no file {rest!r}")
    return str(path)


def ensure_built(folder: Path, asset: Asset, what: str = "") -> None:
    """Build ``asset`` into ``folder`` unless a whole build is there, saying so first
    (``what`` names it, default the folder's name): why, and about how long it takes. A
    damaged one is removed and built again, with a warning naming the file and what is
    wrong. The build holds the asset's lock: a process that needs the same asset meanwhile
    waits for it, then uses what the other built."""
    if folder in _whole:
        return
    if _problem(folder) is None:
        _whole.add(folder)
        return
    what = what or folder.name
    with _build_lock(folder, what):
        problem = _problem(folder)  # another process may have built it while this one waited
        if problem is not None:
            why = f"first use: not yet in {folder.parent}"
            if problem:
                from searchr1.core.logs import get_logger

                get_logger().warning(
                    "cache_damaged",
                    path=str(folder),
                    problem=problem,
                    action="discarded, built again",
                )
                shutil.rmtree(folder, ignore_errors=True)
                why = f"the copy in {folder.parent} is damaged: {problem}"
            _announce("asset_building", asset=what, why=why, takes=asset.takes, folder=folder)
            start = time.monotonic()
            build(folder, asset)
            done = Built(what, why, folder, time.monotonic() - start)
            built.append(done)
            _announce("asset_built", asset=what, seconds=round(done.seconds, 1), folder=folder)
    _whole.add(folder)


def _problem(folder: Path) -> str | None:
    """None when ``folder`` holds a whole build, ``""`` when it holds none, else what is
    wrong with it."""
    if not (folder / COMPLETE).exists():
        return ""
    return _damage(folder)


@contextmanager
def _build_lock(folder: Path, what: str) -> Iterator[None]:
    """The lock of building ``folder`` (a flock on ``.<name>.lock`` beside it, which stays:
    :func:`~searchr1.core.disk.flock_folder`), waited for, saying so, while another process
    builds the same asset; builds of other assets go on meanwhile."""
    lock = folder.parent / f".{folder.name}.lock"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(folder)) from None
    try:
        fd = flock_folder(lock)
    except BlockingIOError:
        _announce("asset_waiting", asset=what, folder=folder)
        fd = flock_folder(lock, wait=True)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _announce(event: str, *, asset: str, folder: Path, **fields: object) -> None:
    """An info ``event``, and for a person (when no console draws the events) a sentence on
    stderr, once per torchrun job: a build of tens of seconds must not look like a hang."""
    from searchr1.core.distributed import speaks_for_job
    from searchr1.core.logs import get_logger, on_screen

    get_logger().info(event, asset=asset, folder=str(folder), **fields)
    if on_screen() or not speaks_for_job():
        return
    if event == "asset_building":
        takes = f"; it takes {fields['takes']}" if fields.get("takes") else ""
        line = f"building {asset} ({fields['why']}){takes}; later commands reuse it"
    elif event == "asset_built":
        line = f"built {asset} in {fields['seconds']} s: {folder}"
    else:
        line = f"waiting for another process to finish building {asset} into {folder}"
    print(f"searchr1: {line}", file=sys.stderr, flush=True)


def _damage(folder: Path) -> str | None:
    """What is wrong with the built ``folder`` (see :func:`searchr1.core.artifacts.damage`);
    a marker written before sizes were recorded (``ok``) leaves the header checks only."""
    try:
        recorded = json.loads((folder / COMPLETE).read_text("utf-8")).get("files")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        recorded = None
    return damage(folder, recorded, only=lambda name: name != COMPLETE)


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
        (tmp / COMPLETE).write_text(json.dumps({"files": file_sizes(tmp)}))
        match_umask(tmp)  # a shared cache: readable as the umask allows
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / COMPLETE).exists():  # a concurrent build won; otherwise retry
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


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
