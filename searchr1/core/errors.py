"""The base class of errors a user can fix.

Raised anywhere (core, plugins, data loading) when the cause is the user's input: a config
value, a file, a command-line flag, a rejected key. :func:`searchr1.core.cli.main` catches it
(with :class:`~searchr1.core.config.ConfigError` and
:class:`~searchr1.core.plugins.PluginError`) and prints the message with exit code 2 instead
of a traceback, so the message must name the field, file or variable to fix.

It lives here rather than in ``cli.py`` so that library code can raise it without importing
the command line (and argparse) it is otherwise unrelated to.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the CLI prints it without a traceback (exit code 2)."""


class ConfigValueError(UserError, ValueError):
    """A config value that passed validation but turns out unusable when it is used: a model
    or tokenizer that does not load, a device that is absent, a prompt longer than the
    trajectory budget. The message names the field. Also a ``ValueError``, for callers that
    caught the plain ``ValueError`` these used to be."""
