"""What a command does when the disk says no, and how its files are written so that a failed
write never leaves a file a later read takes for complete.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from searchr1.core.old_imports import warn_plugins

#: the errnos that mean "the filesystem refused the write", not a bug in searchr1
DISK_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)

_ADVICE = {
    errno.ENOSPC: "free some space there",
    errno.EDQUOT: "free some space there or raise your disk quota",
    errno.EROFS: "the filesystem is read-only: remount it read-write or use a writable folder",
    errno.EIO: "the disk reported an I/O error: check it (dmesg, SMART) or use another disk",
    errno.EACCES: "no permission there: fix the owner or mode of the file or its folder, or "
    "use another folder",
    errno.EPERM: "the system does not permit this (owner, mode or an immutable flag): fix it "
    "or use another folder",
}
#: errnos only a write gets; the others (EIO, EACCES, EPERM) may come from a read too
_WRITE_ONLY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def is_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` with one of :data:`DISK_ERRNOS`."""
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


#: how a library with its own writer quotes the errno (safetensors: ``(os error 28)``)
_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)")


def as_disk_error(exc: BaseException) -> OSError | None:
    """The disk's refusal behind ``exc``, if any: ``exc`` itself, an ``OSError`` it was
    raised from or while handling (torch wraps the file object's error), or an errno a
    library quoted in its message (safetensors); None when the disk is not the cause."""
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if is_disk_error(cause):
            return cause  # type: ignore[return-value]
        match = _ERRNO_IN_TEXT.search(str(cause))
        number = int(match.group(1)) if match else None
        if number in DISK_ERRNOS:
            return OSError(number, os.strerror(number), getattr(cause, "filename", None))
        cause = cause.__cause__ or cause.__context__
    return None


def free_bytes(path: Path | str) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing folder), or None
    when even that cannot be asked."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return shutil.disk_usage(here).free
    except OSError:
        return None


def used_bytes(folder: Path) -> int:
    """The bytes ``folder``'s files occupy on disk (allocated blocks, as ``du`` counts)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue
        total += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
    return total


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def resume_command(run_dir: Path, config_source: str | None = None, *, resume: bool = True) -> str:
    """The command that continues the train run in ``run_dir`` (``resume`` False: that
    starts it again there, when it has no checkpoint to continue from)."""
    config = ""
    if config_source and not config_source.startswith("<"):  # not the embedded default
        config = f" --config {config_source}"
    flag = " --resume" if resume else ""
    return f"searchr1 train{flag} --run-dir {run_dir}{config}"


def describe_refusal(exc: OSError, fallback: Path | None) -> tuple[list[str], str]:
    """The lines that say what the disk refused (the path, or a file in ``fallback``; the
    reason; the free space there) and the advice for that errno."""
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    reason = exc.strerror or str(exc)
    where = Path(exc.filename) if exc.filename else fallback
    target = str(where) if exc.filename else f"a file in {where}" if where else "a file"
    verb = "write" if exc.errno in _WRITE_ONLY else "access"
    lines = [f"cannot {verb} {target}: {reason} ({code})"]
    if where is not None:
        free = free_bytes(where)
        lines.append(f"free space there: {human_bytes(free) if free is not None else 'unknown'}")
    return lines, _ADVICE.get(exc.errno or 0, "fix the disk")


def warn_if_low_space(folder: Path, last_checkpoint: Path | None) -> str | None:
    """Before writing a checkpoint into ``folder``: a warning (printed to stderr and
    returned) when the free space is under twice ``last_checkpoint``'s size."""
    if last_checkpoint is None:
        return None
    size = used_bytes(last_checkpoint)
    free = free_bytes(folder)
    if free is None or size == 0 or free >= 2 * size:
        return None
    warning = (
        f"low disk space: {human_bytes(free)} free in {folder}, under twice the last "
        f"checkpoint's size ({human_bytes(size)}, {last_checkpoint.name}); free some space "
        f"before the run fills the disk"
    )
    print(f"searchr1: warning: {warning}", file=sys.stderr)
    return warning


def flock_folder(folder: Path, *, wait: bool = False) -> int | None:
    """The descriptor holding the exclusive flock of the folder ``folder`` itself (no lock
    file to leave behind; close it to let go, and the system lets go when the process dies,
    SIGKILL included). Without ``wait``, BlockingIOError when another process holds it. None
    where there are no such locks (Windows, some NFS): nothing can be known of other
    processes."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:  # not supported on this filesystem
        os.close(fd)
        return None
    return fd


def hold_folder(folder: Path, doing: str, then: str) -> int | None:
    """:func:`flock_folder` for as long as this process is ``doing`` the folder; another
    process holding it is a UserError naming that process, and what to do ``then`` once it
    is stopped."""
    from searchr1.core.errors import UserError

    try:
        return flock_folder(folder)
    except BlockingIOError:
        pid = _flock_holder(folder)
        raise UserError(
            f"{str(folder)!r} is being {doing} by {f'process {pid}' if pid else 'another process'}"
            f" now: two at once would write over each other's files. Wait for it to end, or stop"
            f" it ({f'`kill -TERM {pid}`' if pid else 'Ctrl-C in its terminal'}) and {then}"
        ) from None


def _flock_holder(path: Path) -> int | None:
    """The pid holding a flock on ``path``, read from Linux's /proc/locks (None elsewhere)."""
    try:
        st = path.stat()
        locks = Path("/proc/locks").read_text()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def make_temp_file(folder: Path, prefix: str, suffix: str = "") -> tuple[int, Path]:
    """A new file in ``folder`` (``prefix``, a random part, ``suffix``) open for reading and
    writing: its descriptor and path. Created with the mode a plain ``open`` gives (0666 less
    the umask), so the file it is renamed to is as readable as any other the user writes
    (``tempfile.mkstemp`` makes 0600: a team could not read a shared run or serve its index)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = Path(folder) / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


def make_temp_dir(folder: Path, prefix: str) -> Path:
    """A new folder in ``folder`` (``prefix`` and a random part), made with the mode a plain
    ``mkdir`` gives (0777 less the umask; ``tempfile.mkdtemp`` makes 0700): what a checkpoint,
    an index or an asset is built in before it is renamed into place."""
    for _ in range(100):
        path = Path(folder) / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(folder))


def match_umask(folder: Path) -> None:
    """Give every file and folder under ``folder`` (one :func:`make_temp_dir` made, before it
    is renamed into place) the modes the umask gives new ones, read off ``folder`` itself
    (execute bits kept): a library that writes through a temporary file of its own leaves
    0600 (safetensors' ``save_file``, the adapter weights of a checkpoint and the tiny
    models' asset)."""
    folder_mode = stat.S_IMODE(folder.stat().st_mode)
    for path in folder.rglob("*"):
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        want = folder_mode if stat.S_ISDIR(st.st_mode) else folder_mode & (0o666 | mode)
        if mode != want:
            path.chmod(want)


@contextmanager
def atomic_write(path: Path, mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing and, when the block ends without an
    error, flush it to disk and rename it to ``path``. On an error the temporary file is
    removed and ``path`` is left as it was; an ``OSError`` names ``path``."""
    path = Path(path)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    try:
        fd, tmp = make_temp_file(path.parent, f".{path.name}.", ".tmp")
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _naming(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text`` (UTF-8) in full, or is left as it was (:func:`atomic_write`)."""
    with atomic_write(path) as fh:
        fh.write(text)


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` with ``path`` as its file (the temporary name means nothing to a user)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
