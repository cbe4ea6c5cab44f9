"""Cheap checks that a folder searchr1 wrote is still whole when it is read again.

A folder written to a temporary name and renamed into place (a checkpoint, a built-in asset, a
converted model file) is whole when renamed; a full disk, a copy cut short or a hand edit can
still damage it later. Two checks, neither reading more than a file's header.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

#: JSON files up to this size are parsed whole by :func:`format_problem`
JSON_CHECK_BYTES = 1 << 20


def file_sizes(folder: Path, *, skip: Callable[[str], bool] = lambda name: False) -> dict[str, int]:
    """``{path relative to folder (POSIX): size in bytes}`` of every file under ``folder``,
    except those ``skip`` names."""
    out = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and not skip(name):
            out[name] = path.stat().st_size
    return out


def damage(
    folder: Path,
    sizes: Mapping[str, int] | None,
    *,
    only: Callable[[str], bool] = lambda name: True,
) -> str | None:
    """What is wrong with ``folder``, as ``"<file> is <what>"``, or None when it is whole:
    a file of ``sizes`` (what :func:`file_sizes` recorded; None: nothing recorded) missing or
    of another size, or a file with no recorded size whose header disagrees with its length
    (:func:`format_problem`; a recorded size already shows a cut). ``only``: the relative
    names to check."""
    for name, size in (sizes or {}).items():
        if not only(name):
            continue
        path = folder / name
        try:
            got = path.stat().st_size
        except FileNotFoundError:
            return f"{path} is missing"
        if got != size:
            what = "truncated" if got < size else "not the file saved"
            return f"{path} is {what} ({got} bytes, {size} when it was written)"
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and only(name) and name not in (sizes or {}):
            problem = format_problem(path)
            if problem:
                return f"{path} is {problem}"
    return None


def format_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole file of the format its name says, from its header; None
    when it looks whole, or the format states no length (see the module docstring)."""
    try:
        if path.suffix == ".safetensors":
            return _safetensors_problem(path)
        if path.suffix in (".pt", ".pth"):
            return _torch_zip_problem(path)
        if path.suffix == ".json" and path.stat().st_size <= JSON_CHECK_BYTES:
            try:
                json.loads(path.read_bytes())
            except (UnicodeDecodeError, ValueError) as exc:
                return f"damaged (not readable JSON: {exc})"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then exactly the bytes
    its tensors' ``data_offsets`` cover."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes: not even a safetensors header)"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return f"truncated ({size} bytes, its header alone says {8 + header_len})"
        try:
            header = json.loads(fh.read(header_len))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                default=0,
            )
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError) as exc:
            return f"damaged (its safetensors header does not parse: {exc})"
    want = 8 + header_len + end
    if size != want:
        what = "truncated" if size < want else "damaged"
        return f"{what} ({size} bytes, its safetensors header describes {want})"
    return None


def _torch_zip_problem(path: Path) -> str | None:
    """``torch.save`` writes a zip file, whose directory is at its end: a cut-off file has
    none. A file that is not a zip at all (an old pickle format) states no length."""
    with path.open("rb") as fh:
        magic = fh.read(2)
    if not magic:
        return "empty (0 bytes)"
    if magic != b"PK":
        return None
    try:
        with zipfile.ZipFile(path):
            return None
    except zipfile.BadZipFile as exc:
        return f"truncated or damaged (a torch file whose zip directory is unreadable: {exc})"
