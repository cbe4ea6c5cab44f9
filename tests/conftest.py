"""Shared fixtures: the fake ``scripted`` model provider plugin.

``scripted_plugin`` makes every registry the CLI loads (``searchr1.core.runs.open_run``)
include :class:`tests.fakes.ScriptedPlugin`, registered through the same hook a third-party
model provider implements, so ``[model] provider = "scripted"`` works in ``searchr1 smoke``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import ScriptedPlugin  # noqa: E402


@pytest.fixture
def scripted_plugin(monkeypatch: pytest.MonkeyPatch) -> ScriptedPlugin:
    from searchr1.core import plugins, runs

    plugin = ScriptedPlugin()
    real = plugins.load_registry
    monkeypatch.setattr(runs, "load_registry", lambda extra=(): real([plugin, *extra]))
    return plugin


@pytest.fixture(autouse=True)
def _reset_logging():
    """Undo ``setup_logging`` after every test. A command run in-process (``open_run``) binds
    structlog to the test's captured stdout and opens the run's events file; without this a
    later test that logs writes to a closed stream (``I/O operation on closed file``)."""
    yield
    import structlog

    from searchr1.core import logs

    logs.close_sinks()  # metric sinks and the console's bars of an in-process run
    sink, logs._file_sink = logs._file_sink, None
    if sink is not None:
        sink.close()
    structlog.reset_defaults()
