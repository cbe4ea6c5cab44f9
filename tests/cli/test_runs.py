"""Building a run's plugins: a failed model start closes the search provider it opened, and a
model factory that returns anything but a ``Model`` is named. A run owns its event stream and
the secrets it masks: two runs of one process keep their events apart."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from searchr1.core.config_schema import Config
from searchr1.core.errors import PluginError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.logs import get_logger, read_jsonl
from searchr1.core.plugins import load_registry
from searchr1.core.runs import Run, open_run
from searchr1.core.types import SearchResponse
from searchr1.kit.search.keys import KeyPool


class _Search:
    closed = False

    async def search(self, query: str, top_k: int) -> SearchResponse:
        return SearchResponse()

    def metrics(self, reset: bool = False) -> dict[str, float]:
        return {}

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        _Search.closed = True


class _Plugin:
    @hookimpl
    def register_search_providers(self, register):
        register("recording", lambda config: _Search())

    @hookimpl
    def register_model_providers(self, register):
        def broken(config):
            raise OSError("model.base_model = 'nowhere': not found")

        register("broken", broken)
        register("bare", lambda config: object())  # not a Model(sampler, trainer)


def test_failed_model_start_closes_the_search_provider(tmp_path: Path) -> None:
    config = Config().replace(model={"provider": "broken"}, search={"provider": "recording"})
    run = Run(config, load_registry(extra_plugins=[_Plugin()]), tmp_path)
    with pytest.raises(OSError, match="nowhere"):
        asyncio.run(run.start(need_loss=True))
    assert _Search.closed


def test_a_factory_that_returns_no_model_is_named(tmp_path: Path) -> None:
    _Search.closed = False
    config = Config().replace(model={"provider": "bare"}, search={"provider": "recording"})
    run = Run(config, load_registry(extra_plugins=[_Plugin()]), tmp_path)
    with pytest.raises(
        PluginError, match="model.provider = 'bare'.*not a searchr1.core.types.Model"
    ):
        asyncio.run(run.start())
    assert _Search.closed


def test_two_runs_in_one_process_keep_their_events_apart_and_keys_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs opened one after the other in one process (the Python API, a notebook): each
    run's events.jsonl holds its own events only, what is logged between them goes to stderr,
    and a key the first run's search provider registered stays masked in the second run
    (an object of the first run, the API's search client, may still hold and quote it)."""
    registry = load_registry()
    config = dataclasses.replace(Config(), secrets=frozenset({"config-secret-of-run-one"}))

    with open_run(config, "smoke", registry=registry, run_dir=str(tmp_path / "one")) as one:
        KeyPool(["pool-key-of-run-one"], provider="search")  # as a search provider does
        get_logger().info("first", detail="one")
    assert "pool-key-of-run-one" in one.log.secrets
    get_logger().info("between", detail="pool-key-of-run-one")
    with open_run(Config(), "smoke", registry=registry, run_dir=str(tmp_path / "two")) as two:
        get_logger().info("second", url="https://x/?key=pool-key-of-run-one")
        get_logger().info("quoted", detail="config-secret-of-run-one")

    first, _ = read_jsonl(tmp_path / "one" / "events.jsonl")
    second, _ = read_jsonl(tmp_path / "two" / "events.jsonl")
    assert [e["event"] for e in first] == ["run_start", "first"]
    assert [e["event"] for e in second] == ["run_start", "second", "quoted"]
    assert {e["run_id"] for e in first} == {"one"} and {e["run_id"] for e in second} == {"two"}
    assert second[1]["url"] == "https://x/?key=***" and second[2]["detail"] == "***"
    assert two.log is not None and two.log is not one.log
    between = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "{" in line]
    assert [e["event"] for e in between if e.get("event") == "between"] == ["between"]
    assert "pool-key-of-run-one" not in json.dumps(between)
