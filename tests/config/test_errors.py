"""One error family: every error searchr1 raises on purpose derives from SearchR1Error, the
names stay importable from where plugins import them, and the command's exit code is the
class's ``exit_code`` (printed as a message, never a traceback)."""

from __future__ import annotations

import signal

import pytest

from searchr1.cli import plugins as plugins_command
from searchr1.core.errors import (
    ConfigError,
    ConfigValueError,
    EnvironmentDown,
    Interrupted,
    PluginError,
    SearchR1Error,
    UserError,
)


def test_every_error_is_a_searchr1_error() -> None:
    for kind in (UserError, ConfigValueError, ConfigError, PluginError, EnvironmentDown):
        assert issubclass(kind, SearchR1Error)
    assert issubclass(ConfigValueError, ValueError)  # callers that caught ValueError
    assert issubclass(EnvironmentDown, RuntimeError)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UserError("data.train: file not found"), 2),
        (ConfigValueError("model.device: no such device"), 2),
        (ConfigError(["rollout.group_size: must be >= 1", "train.lr: must be > 0"]), 2),
        (PluginError("model.provider = 'x': not installed"), 2),
        (EnvironmentDown("search failed 5 steps in a row"), 3),
        (Interrupted(signal.SIGTERM, "RL step 3"), 143),
        (Interrupted(signal.SIGINT, "the model load"), 130),
    ],
)
def test_exit_code_follows_the_class(monkeypatch, run_cli, error, code) -> None:
    def fail(args) -> int:
        raise error

    monkeypatch.setattr(plugins_command, "cmd_plugins", fail)
    result = run_cli("plugins")
    err = result.err
    assert result.code == code
    # a stop is not an error: it says what stopped the command
    head = "searchr1: stopped by" if isinstance(error, Interrupted) else "searchr1: error:"
    assert err.startswith(head) and "Traceback" not in err
    assert str(error).splitlines()[0] in err


def test_a_plugin_error_kind_chooses_its_own_exit_code(monkeypatch, run_cli) -> None:
    class QuotaExhausted(SearchR1Error):
        exit_code = 5

    def fail(args) -> int:
        raise QuotaExhausted("search.api_keys: every key is over its quota")

    monkeypatch.setattr(plugins_command, "cmd_plugins", fail)
    result = run_cli("plugins")
    assert result.code == 5 and "every key is over its quota" in result.err
