"""One command's stop: SIGINT/SIGTERM ask it to end, and every phase of it honours that.

A command that runs long work (``train``, ``eval``, ``smoke``, ``index build``) installs one
:class:`Stop` for its whole run (:meth:`Stop.installed`; the run carries it as ``Run.stop``).
The first signal only asks; each phase then ends at its next unit of work and raises
:class:`~searchr1.core.errors.Interrupted`, naming the phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.core.distributed import speaks_for_job
from searchr1.core.errors import Interrupted
from searchr1.core.old_imports import warn_plugins

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.distributed import World

T = TypeVar("T")

#: what a stop of a phase gives instead of its work's result (None: the stop ends the command)
OnStop = Callable[[Interrupted], Any] | None

#: the signals a :class:`Stop` answers
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """Whether (and by which signal) the command was asked to stop. Until
    :meth:`installed`, nothing sets it (a run of the Python API stops as Python does)."""

    def __init__(self, *, second_exits: bool = True) -> None:
        #: a second signal exits the process at once (not under torchrun)
        self.second_exits = second_exits
        #: the first signal received, None until one arrives
        self.signum: int | None = None
        #: what the run folder keeps and the command that goes on, as the command last saved
        #: (``train`` sets it): a second signal, which ends the process before any save, says it
        self.kept = ""
        self._wakeups: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._at_once = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stop]:
        """Answer SIGINT/SIGTERM for the block (from the main thread; elsewhere nothing is
        installed), then restore the handlers there were."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            if self.second_exits:
                _exit_at_once(signum, self.kept)
            return
        self.signum = signum
        # Not logged here: the main thread may be inside a write that holds the log's lock.
        # (In the command's context: the log's run id is bound there.)
        announce = functools.partial(contextvars.copy_context().run, self._announce)
        threading.Thread(target=announce, name="searchr1-stop", daemon=True).start()
        for loop, event in list(self._wakeups):
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)
        if self._at_once:
            # a BaseException, so that no library's `except Exception` swallows it;
            # at_once turns it into Interrupted
            raise KeyboardInterrupt

    def _announce(self) -> None:
        """The ``stop_requested`` event, and a note on stderr saying what happens next."""
        import structlog

        assert self.signum is not None
        name = signal.Signals(self.signum).name
        if structlog.is_configured():  # a command with a run folder's log (not index build)
            structlog.get_logger().warning("stop_requested", signal=name)
        again = "; Ctrl-C again exits at once" if self.second_exits else ""
        if speaks_for_job():  # once per torchrun job, not once per rank
            print(
                f"searchr1: {name}: stopping at the end of this unit of work{again}",
                file=sys.stderr,
            )

    def interrupted(self, phase: str) -> Interrupted:
        """The error that ends ``phase`` (the command adds what it kept)."""
        assert self.signum is not None
        return Interrupted(self.signum, phase)

    def asked(self, world: World | None = None) -> int | None:
        """The signal that asked for a stop, None before one; with ``world`` (a torchrun
        job) the first any rank got, on every
        rank (call it at the same point on every rank)."""
        signums = [self.signum] if world is None else world.gather(self.signum)
        return next((s for s in signums if s is not None), None)

    def check(self, phase: str, world: World | None = None) -> None:
        """Raise :class:`Interrupted` ending ``phase`` if a stop was asked (with ``world``:
        on any rank; every rank raises, see :meth:`asked`)."""
        signum = self.asked(world)
        if signum is not None:
            raise Interrupted(signum, phase)

    async def phase(
        self,
        name: str,
        work: Awaitable[T] | None,
        world: World,
        *,
        alone: bool = False,
        on_stop: OnStop = None,
    ) -> T | None:
        """Await ``work`` (None: this rank has none of it) as the phase ``name`` of the
        ``world``'s ranks. A stop cuts it short where no collective is left waiting: in one
        process, or ``alone`` (rank 0's own work); under torchrun other work is finished.
        Without ``on_stop`` the ranks agree on a stop (:meth:`check`) as the phase begins
        and as it ends, and it ends the command there (:class:`Interrupted` naming ``name``):
        every rank calls it. With ``on_stop`` a stop of ``work`` gives ``on_stop``'s value
        instead, and the caller goes on to its own boundary."""
        if on_stop is None and (signum := self.asked(world)) is not None:
            if inspect.iscoroutine(work):
                work.close()  # never awaited: no "was never awaited" warning
            raise Interrupted(signum, name)
        result = None
        try:
            if work is not None:
                cut = alone or world.size == 1
                result = await (self.cut(work, name) if cut else work)
        except Interrupted as exc:
            if on_stop is not None:
                return on_stop(exc)
            if world.size == 1:
                raise
        if on_stop is None:
            self.check(name, world)
        return result

    async def cut(self, work: Awaitable[T], phase: str) -> T:
        """``await work``, unless a stop is asked first: then ``work`` is cancelled and
        :class:`Interrupted` raised. Only for work with no torchrun collective inside (a
        rank that cut it would leave its peers waiting)."""
        if self.requested:
            if inspect.iscoroutine(work):
                work.close()  # never awaited: no "was never awaited" warning
            raise self.interrupted(phase)
        loop = asyncio.get_running_loop()
        wakeup = (loop, asyncio.Event())
        self._wakeups.add(wakeup)
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(wakeup[1].wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            self._wakeups.discard(wakeup)
            waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise self.interrupted(phase)
        return task.result()

    @contextlib.contextmanager
    def at_once(self, phase: str) -> Iterator[None]:
        """A signal during the block interrupts it where it is (a load with nothing to
        keep) and raises :class:`Interrupted` naming ``phase``."""
        self.check(phase)
        self._at_once += 1
        try:
            yield
        except KeyboardInterrupt:
            if self.signum is None:
                raise
            raise self.interrupted(phase) from None
        finally:
            self._at_once -= 1


def _exit_at_once(signum: int, kept: str = "") -> None:
    """End the process now (a second signal): no cleanup runs, a checkpoint being written
    is not kept (the last complete one is: ``kept`` says which, and how to go on). Written
    with ``os.write``: the main thread may hold the lock of ``sys.stderr``."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    name = signal.Signals(signum).name
    said = f"searchr1: stopped at once by a second {name}" + (f"; kept: {kept}" if kept else "")
    with contextlib.suppress(OSError):
        os.write(2, f"{said}\n".encode())
    os._exit(128 + signum)


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
