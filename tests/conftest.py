"""Shared fixtures: the fake ``scripted`` model provider plugin, built-in plugins only, a
config file in ``tmp_path`` (``config_file``) and the CLI run in-process (``run_cli``).

``scripted_plugin`` makes every registry a command loads include
:class:`tests.fakes.ScriptedPlugin`, registered through ``$SEARCHR1_PLUGINS`` and the same hook
a third-party model provider implements, so ``[model] provider = "scripted"`` works in
``searchr1 smoke``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Built-in plugins only, in this process and every command a test starts: a plugin that
# happens to be installed in the developer's environment must not change what tests see
# (a test of a third-party plugin installs it and names it in this variable).
os.environ["SEARCHR1_LOAD_PLUGINS"] = ""

#: The test run's own cache folder: built assets (the SmolLM2 conversion, ~30 s and 520 MB;
#: the tiny models) are built once per run into it and shared by the xdist workers, which
#: inherit the variable from the process that made the folder (and removes it at the end).
#: Set it to a folder of your own to keep the assets between runs. Never the user's
#: ~/.cache/searchr1 nor their hub cache: a test must pass on a fresh machine, and must not
#: pass only because the developer's caches hold something.
RUN_CACHE_VAR = "SEARCHR1_TEST_CACHE"
_OWN_RUN_CACHE = RUN_CACHE_VAR not in os.environ
if _OWN_RUN_CACHE:
    os.environ[RUN_CACHE_VAR] = tempfile.mkdtemp(prefix="searchr1-test-cache-")
_RUN_CACHE = Path(os.environ[RUN_CACHE_VAR])
os.environ["SEARCHR1_CACHE"] = str(_RUN_CACHE / "searchr1")
os.environ["HF_HOME"] = str(_RUN_CACHE / "huggingface")  # the hub cache, its token file too
for _var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_TOKEN_PATH"):
    os.environ.pop(_var, None)  # each would point the hub back at the user's files

# tests/helpers/ is on sys.path through pytest's ``pythonpath`` setting (pyproject.toml)
import cli_run  # noqa: E402
from fakes import ScriptedPlugin  # noqa: E402

if TYPE_CHECKING:
    from searchr1.core.plugins import Registry


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's cache folder goes with the run that made it (not with an xdist worker)."""
    if _OWN_RUN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)


@pytest.fixture
def loop() -> Iterator[asyncio.Runner]:
    """The test's one event loop, as a command has one: the clients and providers a test
    uses belong to the loop of their first call, so every ``loop.run(coro)`` shares it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture
def scripted_plugin(monkeypatch: pytest.MonkeyPatch) -> ScriptedPlugin:
    """The ``scripted`` model provider in every registry a command loads: its module
    (``tests/helpers/scripted_plugin.py``) named in ``$SEARCHR1_PLUGINS``, as a plugin under
    development is."""
    import scripted_plugin as module

    from searchr1.core.plugins import MODULES_VAR

    monkeypatch.setenv(MODULES_VAR, module.__name__)
    module.PLUGIN.created.clear()
    return module.PLUGIN


@pytest.fixture
def config_file(tmp_path: Path) -> Callable[..., Path]:
    """``config_file(text, name="config.toml")``: ``text`` written into ``tmp_path``."""

    def write(text: str, name: str = "config.toml") -> Path:
        return cli_run.write_config(tmp_path, text, name)

    return write


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., cli_run.Result]:
    """``run_cli(*argv)``: ``searchr1 ARGV`` run in this process, as ``Result(code, out, err)``."""

    def run(*argv: str | Path, registry: Registry | None = None) -> cli_run.Result:
        return cli_run.run_cli(capsys, *argv, registry=registry)

    return run


@pytest.fixture(autouse=True)
def _reset_logging():
    """Undo ``setup_logging`` after every test. A test's own stream (or a command's run the
    test left open) binds structlog to the test's captured stdout and holds an events file;
    without this a later test that logs writes to a closed stream (``I/O operation on closed
    file``)."""
    yield
    import structlog

    from searchr1.core import logs

    bound = logs.bound_log()  # a test's own setup_logging (a command closes its run's)
    if bound is not None:
        bound.close()  # the console's bar and the events file
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _search_answer_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test keeps search answers on disk in its own folder (commands it starts inherit the
    variable): answers a keyed service gave one test must not answer another's queries, nor
    land in the developer's cache folder."""
    path = tmp_path / "search-answers"
    monkeypatch.setenv("SEARCHR1_SEARCH_CACHE", str(path))
    return path
