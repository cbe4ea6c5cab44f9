"""Building a run's plugins: a failed model start closes the search provider it opened, and a
model factory that returns anything but a ``Model`` is named."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from searchr1.core.config_schema import Config
from searchr1.core.errors import PluginError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import load_registry
from searchr1.core.runs import Run
from searchr1.core.types import SearchResponse


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
