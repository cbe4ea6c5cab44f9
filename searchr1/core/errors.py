"""The one family of errors searchr1 raises on purpose, and the exit code of each.

Every error the CLI prints as a plain message (no traceback) derives from
:class:`SearchR1Error`; ``exit_code`` is what ``searchr1`` exits with::

    SearchR1Error          exit 1  a check failed
    ├── UserError          exit 2  the user's input: a value, a file, a flag, a rejected key
    │   └── ConfigValueError       a config value that is unusable when it is used
    ├── ConfigError        exit 2  every problem found in one config file, one per line
    ├── PluginError        exit 2  a plugin failed to load, clashes, or is not installed
    ├── EnvironmentDown    exit 3  the search environment stayed broken past the retries
    ├── DiskError          exit 4  a write the filesystem refused: full, over quota,
    │                              read-only, an I/O error, no permission
    ├── HealthStop         exit 5  a health alert ended training ([train.health]
    │                              on_alert = "stop"), after a checkpoint
    └── Interrupted        exit 130 / 143 (128 + the signal), SIGINT / SIGTERM: what the
                                   command kept and how to go on

A user-facing message must name the field, file or variable to fix. Kept out of the CLI so
library code can raise them without importing it.
"""

from __future__ import annotations

import signal

#: ``searchr1 train`` stopped because search stayed down (see :class:`EnvironmentDown`).
EXIT_ENVIRONMENT_DOWN = 3
#: a write failed because of the disk, not searchr1 (see :class:`DiskError`).
EXIT_DISK = 4
#: ``searchr1 train`` stopped on a health alert (see :class:`HealthStop`).
EXIT_HEALTH_STOP = 5


class SearchR1Error(Exception):
    """The root: an error searchr1 reports as a message and an exit code, not a traceback."""

    exit_code: int = 1


class UserError(SearchR1Error):
    """A problem the user can fix; the CLI prints it without a traceback (exit code 2)."""

    exit_code = 2


class ConfigValueError(UserError, ValueError):
    """A config value that passed validation but is unusable when used (a model that does not
    load, a prompt over the trajectory budget); names the field. Also a ``ValueError``."""


class ConfigError(SearchR1Error):
    """Every problem found in one config file, one per line (exit code 2)."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(SearchR1Error):
    """A plugin failed to load, clashes, or is not installed (exit code 2)."""

    exit_code = 2


class EnvironmentDown(SearchR1Error, RuntimeError):
    """Search stayed broken past the guard's retries (exit code 3; also a ``RuntimeError``)."""

    exit_code = EXIT_ENVIRONMENT_DOWN


class DiskError(SearchR1Error):
    """The filesystem refused a write (ENOSPC, EDQUOT, EROFS, EIO, EACCES, EPERM): the
    message names the path, the free space there, the run's last complete checkpoint and the
    command that continues it (exit code 4). Built by :func:`searchr1.core.disk.disk_error`."""

    exit_code = EXIT_DISK


class Interrupted(SearchR1Error):
    """SIGINT/SIGTERM stopped the command (:mod:`searchr1.core.stop`) during ``phase``;
    ``kept`` says what it saved, ``then`` how to go on (the command that continues). Exits
    128 + the signal (130, 143) as a shell does, so ``searchr1 train && searchr1 eval`` stops
    after Ctrl-C; the CLI prints it as a stop, not an error."""

    def __init__(self, signum: int, phase: str, kept: str = "", then: str = ""):
        self.signum, self.phase, self.kept, self.then = signum, phase, kept, then
        lines = [f"stopped by {signal.Signals(signum).name} during {phase}"]
        lines += [f"kept: {kept}"] if kept else []
        lines += [then] if then else []
        super().__init__("\n".join(lines))

    def outcome(self, kept: str, then: str) -> Interrupted:
        """This stop with what the command kept and how to go on."""
        return Interrupted(self.signum, self.phase, kept, then)

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return 128 + self.signum


class HealthStop(SearchR1Error):
    """A health alert stopped training (``[train.health] on_alert = "stop"``) after the
    step that raised it was checkpointed (exit code 5)."""

    exit_code = EXIT_HEALTH_STOP

    def __init__(self, kind: str, message: str, step: int):
        self.kind, self.step = kind, step
        super().__init__(
            f"health alert {kind} at step {step}: {message}. The run stopped after saving "
            f'checkpoint step {step} ([train.health] on_alert = "stop"; "warn" only logs '
            f"alerts)"
        )
