"""The ``search_r1`` search provider: a client of the original Search-R1 retrieval server.

Registered through the ``searchr1`` entry point (``search_r1``) and chosen by
``[search] provider = "search_r1"``. Protocol (``docs/protocols.md`` §2)::

    POST {api_base}/retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}], ...]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from searchr1.kit.search.batches import QueryBatches
from searchr1.kit.search.documents import DocumentError, row_to_result
from searchr1.kit.search.http_provider import HTTP_SETTINGS, HttpSearchProvider, ResponseError
from searchr1.sdk import (
    Register,
    SearchFactory,
    SearchResponse,
    SearchResult,
    hookimpl,
    plugin_settings,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config


@dataclass(frozen=True)
class SearchR1Settings:
    """``[search.search_r1]``."""

    #: queries arriving this close together go in one request
    batch_window_ms: float = field(default=5.0, metadata={"min": 0})
    #: queries per request at most
    max_batch: int = field(default=64, metadata={"min": 1})
    #: the server's endpoint path
    path: str = "/retrieve"


def search_r1_settings(config: Config) -> SearchR1Settings:
    """``[search.search_r1]`` checked; ConfigError naming the key otherwise."""
    return plugin_settings(config, "search", "search_r1", SearchR1Settings)


def _score(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def parse_retrieve(
    response: httpx.Response, n_queries: int, top_k: int
) -> list[tuple[SearchResult, ...]]:
    """One tuple of results per query; ResponseError for a body of the wrong shape."""
    try:
        body = response.json()
    except ValueError:
        raise ResponseError("malformed response (not JSON)") from None
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise ResponseError("malformed response (expected one result list per query)")
    out: list[tuple[SearchResult, ...]] = []
    for hits in result:
        if not isinstance(hits, list):
            raise ResponseError("malformed response (a result is not a list)")
        parsed: list[SearchResult] = []
        for hit in hits[:top_k]:
            scored = isinstance(hit, dict) and isinstance(hit.get("document"), dict)
            document = hit["document"] if scored else hit
            try:
                parsed.append(row_to_result(document, _score(hit.get("score")) if scored else 0.0))
            except DocumentError:
                raise ResponseError("malformed response (a document has no contents)") from None
        out.append(tuple(parsed))
    return out


class SearchR1Retriever(HttpSearchProvider):
    """Batches concurrent queries into ``POST /retrieve`` requests; see the module docstring."""

    name = "search_r1"
    default_api_base = "http://127.0.0.1:8000"

    def __init__(self, config: Config, **kwargs: Any):
        self.options = search_r1_settings(config)
        super().__init__(config.search, **kwargs)
        self._batches = QueryBatches(self._answer, self.options, self.name)

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        return await self._batches.ask(query, top_k)

    async def aclose(self) -> None:
        self._batches.cancel()
        await super().aclose()

    async def _answer(self, queries: list[str], top_k: int) -> list[SearchResponse]:
        """One request for the whole batch; a failure is every query's."""
        body = {"queries": queries, "topk": top_k, "return_scores": True}

        def build(client: httpx.AsyncClient, key: str | None) -> httpx.Request:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            return client.build_request("POST", self.options.path, json=body, headers=headers)

        fetched = await self.request(build, lambda r: parse_retrieve(r, len(queries), top_k))
        return [
            SearchResponse(
                results=fetched.value[i] if fetched.value is not None else (),
                error=fetched.error,
                failure=fetched.failure,
            )
            for i in range(len(queries))
        ]


@hookimpl
def register_search_providers(register: Register[SearchFactory]) -> None:
    register("search_r1", SearchR1Retriever, settings=SearchR1Settings, reads=HTTP_SETTINGS)
