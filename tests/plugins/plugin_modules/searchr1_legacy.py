"""A development plugin written against the imports docs/plugins.md showed before searchr1.sdk
(``searchr1.core.hookspecs``, ``searchr1.core.types``, ...): a search provider, ``legacy_echo``,
that returns the query back with a configured prefix. It must keep loading and working."""

from __future__ import annotations

from dataclasses import dataclass

from searchr1.core.config_schema import setting
from searchr1.core.config_validate import plugin_settings
from searchr1.core.errors import UserError
from searchr1.core.hookspecs import Register, hookimpl
from searchr1.core.types import SearchFactory, SearchResponse, SearchResult
from searchr1.kit.http import HttpClient  # noqa: F401  (a kit helper: no warning)
from searchr1.plugins.agent_protocols.call_formats import detect_call_format  # noqa: F401  (moved)


@dataclass(frozen=True)
class LegacySettings:
    prefix: str = setting("legacy: ")


class LegacyEcho:
    def __init__(self, prefix: str) -> None:
        if not isinstance(prefix, str):
            raise UserError("search.legacy_echo.prefix: a string")
        self.prefix = prefix

    async def search(self, query: str, top_k: int) -> SearchResponse:
        return SearchResponse(results=(SearchResult(title="echo", text=self.prefix + query),))

    def metrics(self, reset: bool = False) -> dict[str, float]:
        return {"success_rate": 1.0, "error_rate": 0.0}

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@hookimpl
def register_search_providers(register: Register[SearchFactory]) -> None:
    def create(config):
        return LegacyEcho(plugin_settings(config, "search", "legacy_echo", LegacySettings).prefix)

    register("legacy_echo", create, settings=LegacySettings)
