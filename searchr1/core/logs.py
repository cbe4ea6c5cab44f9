"""Structured logs: JSON lines to ``runs/<run>/events.jsonl`` and to stdout. Each command's
events go through its :class:`RunLog` (the run's, made by ``open_run`` after the config is
loaded, so its secrets are known; :func:`log_to_stderr` before that). Every event
carries ``timestamp``, ``level``, ``event`` and ``run_id``; metrics use ``/``-separated keys
(``reward/mean``) in a ``metrics`` event. Redaction replaces every configured secret and
anything shaped like a bearer token. A command may pass a ``screen`` factory to draw events for
a person instead of printing JSON lines. Metric sinks (:mod:`searchr1.core.sinks`) are fed from
the same stream, after redaction.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Protocol

import structlog

from searchr1.core.old_imports import warn_plugins
from searchr1.core.secrets import Secrets, bind_secrets, bound_secrets


class _JsonLinesFile:
    """A structlog processor that appends the finished event to events.jsonl, one whole line
    per ``write``. A write the disk refuses raises an ``OSError`` naming the file, and so does
    every event after it (a run that cannot record its events stops), without writing more.
    A line a full disk cut short is closed with a newline when the file is opened again, so
    readers (:func:`read_jsonl`) skip that one line and keep the next."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._failed: OSError | None = None
        # close() and a write from another thread (the stop announcer) never interleave: a
        # closed descriptor's number may already name another file
        self._lock = threading.Lock()
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        if _ends_mid_line(path):
            self._write(b"\n")

    def __call__(self, _logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        line = json.dumps(event_dict, default=str, ensure_ascii=False) + "\n"
        with self._lock:
            # closed: an event another thread began before the run closed its stream still
            # reaches the console or stderr after this processor
            if self._fd is not None:
                self._write(line.encode("utf-8"))
        return event_dict

    def _write(self, data: bytes) -> None:
        if self._failed is not None:
            raise OSError(self._failed.errno, self._failed.strerror, str(self.path))
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            self._failed = exc
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)


def _ends_mid_line(path: Path) -> bool:
    with path.open("rb") as fh:
        if fh.seek(0, os.SEEK_END) == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSONL file (``events.jsonl``, trajectory dumps, eval records)
    and the number of lines that were not one: a line a full disk or a crash cut short is
    skipped and counted, never taken for an event."""
    rows: list[dict[str, Any]] = []
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                bad += 1
    return rows, bad


class _Discard(io.TextIOBase):
    """A text stream that drops what it is given and holds no descriptor."""

    def write(self, text: str) -> int:
        return len(text)


#: where a torchrun rank other than 0 prints its events (its own file keeps them)
DISCARD: IO[str] = _Discard()  # type: ignore[assignment]


class Screen(Protocol):
    """Draws events for a person: the last processor and the logger that prints (:meth:`msg`)."""

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> str: ...

    def msg(self, message: str) -> None: ...

    def close(self) -> None: ...


#: ``factory(stream, total_steps)``: the screen of one command
ScreenFactory = Callable[[IO[str], "int | None"], Screen]


class RunLog:
    """One command's event stream: the ``run_id`` its events carry, the :class:`Secrets` they
    are redacted of, the events file they are appended to (``events_path``), and on
    ``stream`` (stdout) the console ``screen(stream, total_steps)`` draws when given, else
    JSON lines. The run that opened it closes it (:meth:`close`)."""

    def __init__(
        self,
        run_id: str | None,
        events_path: Path | None = None,
        *,
        secrets: Secrets,
        screen: ScreenFactory | None = None,
        stream: IO[str] | None = None,
        total_steps: int | None = None,
    ):
        self.run_id = run_id
        self.secrets = secrets
        self.stream = stream or sys.stdout
        self.sink = _JsonLinesFile(events_path) if events_path is not None else None
        self.console = screen(self.stream, total_steps) if screen is not None else None

    def _redact(self, _logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        return self.secrets.redact_value(event_dict)

    def bind(self) -> RunLog:
        """Make this the stream every :func:`get_logger` event, :func:`say` and redaction
        of the process goes to (see :data:`_bound`); the one bound before is closed."""
        global _bound
        previous, _bound = _bound, self
        if previous is not None and previous is not self:
            previous.close()
        processors: list[Any] = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            self._redact,
        ]
        if self.sink is not None:
            processors.append(self.sink)
        if self.console is not None:
            drawn = self.console
            processors.append(drawn)
            logger_factory: Any = lambda *_args: drawn  # noqa: E731 - prints above the bar
        else:
            processors.append(structlog.processors.JSONRenderer(default=str, ensure_ascii=False))
            logger_factory = structlog.PrintLoggerFactory(file=self.stream)
        structlog.configure(
            processors=processors,
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            logger_factory=logger_factory,
            cache_logger_on_first_use=False,
        )
        structlog.contextvars.clear_contextvars()
        if self.run_id is not None:
            structlog.contextvars.bind_contextvars(run_id=self.run_id)
        bind_secrets(self.secrets)
        return self

    def close_console(self) -> None:
        """Close the console's progress bar (end of a command); :meth:`say` then writes to
        stderr."""
        if self.console is not None:
            console, self.console = self.console, None
            console.close()

    def close(self) -> None:
        """End the stream: the console's bar closed, the events file closed. When it is the
        bound one, later events go to stderr (:func:`log_to_stderr`), its secrets still
        redacted."""
        self.close_console()
        sink, self.sink = self.sink, None
        if _bound is self:
            log_to_stderr()  # before the file closes: an event logged meanwhile goes to stderr
        if sink is not None:
            sink.close()

    def on_screen(self) -> bool:
        """Whether the events are drawn for a person (a terminal's console) rather than
        printed as JSON lines: what is an event then needs no :meth:`say` of its own."""
        return self.console is not None

    def say(self, line: str = "") -> None:
        """Tell the person running the command ``line``, beside the event stream: on the
        console (above its progress bar) when one is drawn, else on stderr, so that stdout
        stays JSON lines when piped."""
        if self.console is not None:
            self.console.msg(line)
        else:
            print(line, file=sys.stderr, flush=True)


#: The command's stream, the process's one binding point for logging: structlog's
#: configuration is process-global (every ``get_logger()`` event goes through one processor
#: chain), :func:`say` is called by code no run is handed to, and the atexit hook below has
#: nothing else to reach. :meth:`RunLog.bind` sets it; the run owns the stream and closes it.
_bound: RunLog | None = None


def setup_logging(
    run_id: str | None,
    events_path: Path | None = None,
    *,
    secrets: Iterable[str] = (),
    screen: ScreenFactory | None = None,
    stream: IO[str] | None = None,
    total_steps: int | None = None,
) -> RunLog:
    """A :class:`RunLog`, bound: events go to ``events_path`` and to ``stream`` (stdout),
    drawn by ``screen`` when given; redacted of ``secrets`` and of every secret the process
    has redacted so far (an object of an earlier run, the API's search client, may still
    hold and quote one)."""
    log = RunLog(
        run_id,
        events_path,
        secrets=bound_secrets().extended(secrets),
        screen=screen,
        stream=stream,
        total_steps=total_steps,
    )
    return log.bind()


def log_to_stderr() -> RunLog:
    """Events logged before a command opens its run, after it closes it, or by a command
    that opens none (``config check`` building a ``builtin:`` model), go to stderr as JSON
    lines, secrets redacted: stdout carries only what the command prints."""
    return setup_logging(None, stream=sys.stderr)


def bound_log() -> RunLog | None:
    """The stream the process's events go to now (:meth:`RunLog.bind`)."""
    return _bound


def close_console() -> None:
    """Close the bound stream's progress bar; :func:`say` then writes to stderr. Run at exit
    too: a command that never closed its run (the Python API) still ends its bar."""
    if _bound is not None:
        _bound.close_console()


atexit.register(close_console)


def on_screen() -> bool:
    """Whether the bound stream's events are drawn for a person (:meth:`RunLog.on_screen`)."""
    return _bound is not None and _bound.on_screen()


def say(line: str = "") -> None:
    """:meth:`RunLog.say` of the bound stream (stderr when none is bound)."""
    if _bound is not None:
        _bound.say(line)
    else:
        print(line, file=sys.stderr, flush=True)


def get_logger() -> Any:
    return structlog.get_logger()


def warn(event: str, detail: str) -> None:
    """A warning for the person running the command: a ``warning`` event ``event`` with
    ``detail``, and ``searchr1: warning: detail`` on stderr (stdout stays JSON when piped)."""
    get_logger().warning(event, detail=detail)
    print(f"searchr1: warning: {detail}", file=sys.stderr, flush=True)


def log_metrics(step: int, metrics: dict[str, float]) -> None:
    """One metrics event: ``{"event": "metrics", "step": 3, "reward/mean": 0.4, ...}``."""
    get_logger().info("metrics", step=step, **metrics)


class GroupsDone:
    """``progress`` events of one draw's rollouts (groups done of ``total``), once the draw
    has run :data:`PROGRESS_AFTER_S`, then at most one a second and the last: a step of a few
    seconds shows none, a long one (a real model) shows how far its rollouts are."""

    def __init__(self, task: str, total: int) -> None:
        self.task, self.total, self.done = task, total, 0
        self.start = self.last = time.perf_counter()

    def __call__(self) -> None:
        self.done, now = self.done + 1, time.perf_counter()
        if now - self.start < PROGRESS_AFTER_S or (self.done < self.total and now - self.last < 1):
            return
        self.last = now
        get_logger().info("progress", task=self.task, done=self.done, total=self.total)


#: seconds a draw's rollouts run before its progress shows
PROGRESS_AFTER_S = 2.0


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
