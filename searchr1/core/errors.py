"""The one family of errors searchr1 raises on purpose, and the exit code of each.

Every error the command line turns into a plain message (no traceback) derives from
:class:`SearchR1Error`; its class attribute ``exit_code`` is what ``searchr1`` exits with, so
:func:`searchr1.cli.main.main` needs one ``except`` and no per-class branches::

    SearchR1Error          exit 1  a check failed
    ├── UserError          exit 2  the user's input: a value, a file, a flag, a rejected key
    │   └── ConfigValueError       a config value that is unusable when it is used
    ├── ConfigError        exit 2  every problem found in one config file, one per line
    ├── PluginError        exit 2  a plugin failed to load, clashes, or is not installed
    ├── EnvironmentDown    exit 3  the search environment stayed broken past the retries
    └── Interrupted        exit 130 / 143 (128 + the signal), SIGINT / SIGTERM

Raised anywhere (core, plugins, data loading); a user-facing message must name the field,
file or variable to fix. The classes live here, not in ``cli.py``, so that library code can
raise them without importing the command line (and argparse). ``ConfigError``,
``PluginError``, ``EnvironmentDown`` and ``Interrupted`` stay importable from
``searchr1.core.config``, ``searchr1.core.plugins`` and ``searchr1.core.train``, where they
were defined before this module held them all.
"""

from __future__ import annotations

import signal

#: ``searchr1 train`` stopped because search stayed down (see :class:`EnvironmentDown`).
EXIT_ENVIRONMENT_DOWN = 3


class SearchR1Error(Exception):
    """The root: an error searchr1 reports as a message and an exit code, not a traceback."""

    exit_code: int = 1


class UserError(SearchR1Error):
    """A problem the user can fix; the CLI prints it without a traceback (exit code 2)."""

    exit_code = 2


class ConfigValueError(UserError, ValueError):
    """A config value that passed validation but turns out unusable when it is used: a model
    or tokenizer that does not load, a device that is absent, a prompt longer than the
    trajectory budget. The message names the field. Also a ``ValueError``, for callers that
    caught the plain ``ValueError`` these used to be."""


class ConfigError(SearchR1Error):
    """Every problem found in one config file, one per line (exit code 2). Raised by
    :func:`searchr1.core.config.load_config` and by plugins that validate their own table."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(SearchR1Error):
    """A plugin failed to load, registered a clashing name, or was asked for by a name that
    no plugin registered (exit code 2)."""

    exit_code = 2


class EnvironmentDown(SearchR1Error, RuntimeError):
    """The search environment stayed broken past the guard's retries; ``searchr1 train``
    stops with exit code 3 (a ``RuntimeError`` too, as it was before)."""

    exit_code = EXIT_ENVIRONMENT_DOWN


class Interrupted(SearchR1Error):
    """SIGINT/SIGTERM stopped the loop after a step (checkpointed); the command exits
    128 + the signal number (130, 143), as a shell does for a process a signal ends, so that
    ``searchr1 train && searchr1 eval`` does not go on after Ctrl-C."""

    def __init__(self, signum: int, step: int, saved: bool):
        self.signum, self.step, self.saved = signum, step, saved
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return 128 + self.signum
