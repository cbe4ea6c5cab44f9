"""The ``zhihu`` search provider: Zhihu's global search API (``docs/protocols.md`` §1)."""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from searchr1.kit.search.http_provider import HTTP_SETTINGS, HttpSearchProvider, ResponseError
from searchr1.sdk import (
    Register,
    SearchFactory,
    SearchResponse,
    SearchResult,
    hookimpl,
    plugin_settings,
    redact_text,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config

#: the API returns at most this many items per call
MAX_COUNT = 20
_TAG_RE = re.compile(r"<[^>]{0,200}>")


@dataclass(frozen=True)
class ZhihuSettings:
    """``[search.zhihu]``."""

    #: Zhihu's SearchDB; empty = the service default
    search_db: str = field(default="", metadata={"choices": ("", "all", "realtime", "static")})
    #: Zhihu's Filter, passed through when set
    filter: str = ""
    #: the endpoint path appended to api_base
    path: str = "/api/v1/content/global_search"


def zhihu_settings(config: Config) -> ZhihuSettings:
    """``[search.zhihu]`` checked, and at least one key in ``api_keys``."""

    def needs_a_key(settings: ZhihuSettings) -> list[str]:
        if config.search.api_keys:
            return []
        return [
            "search.api_keys is empty: the zhihu provider needs at least one key "
            '(api_keys = "${ZHIHU_SEARCH_KEYS}", keys separated by commas or newlines)'
        ]

    return plugin_settings(config, "search", "zhihu", ZhihuSettings, needs_a_key)


def _clean(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    return " ".join(html.unescape(_TAG_RE.sub("", value)).split())


def parse_zhihu(response: httpx.Response, top_k: int) -> tuple[SearchResult, ...]:
    """The results of one HTTP 200 answer; ResponseError for a body that is not usable."""
    try:
        body = response.json()
    except ValueError:
        raise ResponseError("malformed response (not JSON)") from None
    if not isinstance(body, dict) or "Code" not in body:
        raise ResponseError("malformed response (no Code field)")
    code = body.get("Code")
    if code != 0:
        message = _clean(body.get("Message"))[:80]
        detail = f": {redact_text(message)}" if message else ""
        raise ResponseError(f"search API error (Code {code}{detail})", kind="api")
    data = body.get("Data")
    if not isinstance(data, dict):
        raise ResponseError("malformed response (no Data object)")
    items = data.get("Items")
    if items is None:
        items = []  # "Items": null is how an empty answer may look
    if not isinstance(items, list):
        raise ResponseError("malformed response (Data.Items is not a list)")
    results: list[SearchResult] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        title, text = _clean(item.get("Title")), _clean(item.get("ContentText"))
        if not (title or text):
            continue
        url = item.get("Url")
        results.append(
            SearchResult(
                title=title,
                text=text,
                url=url if isinstance(url, str) else "",
                score=1.0 / (len(results) + 1),
            )
        )
        if len(results) >= top_k:
            break
    return tuple(results)


class ZhihuSearch(HttpSearchProvider):
    """``GET {api_base}{path}?Query=...&Count=...`` with ``Authorization: Bearer <key>``."""

    name = "zhihu"
    default_api_base = "https://developer.zhihu.com"

    def __init__(self, config: Config, **kwargs: Any):
        self.options = zhihu_settings(config)
        super().__init__(config.search, **kwargs)

    def endpoint(self) -> str:
        o = self.options
        return f"{o.path} SearchDB={o.search_db} Filter={o.filter}"

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        params = {"Query": query, "Count": str(min(top_k, MAX_COUNT))}
        if self.options.search_db:
            params["SearchDB"] = self.options.search_db
        if self.options.filter:
            params["Filter"] = self.options.filter

        def build(client: httpx.AsyncClient, key: str | None) -> httpx.Request:
            headers = {"X-Request-Timestamp": str(int(time.time()))}
            if key is not None:
                headers["Authorization"] = f"Bearer {key}"
            return client.build_request("GET", self.options.path, params=params, headers=headers)

        fetched = await self.request(build, lambda response: parse_zhihu(response, top_k))
        return SearchResponse(
            results=fetched.value or (), error=fetched.error, failure=fetched.failure
        )


@hookimpl
def register_search_providers(register: Register[SearchFactory]) -> None:
    register(
        "zhihu",
        ZhihuSearch,
        settings=ZhihuSettings,
        reads=HTTP_SETTINGS,
        secret_variables={"api_keys": "ZHIHU_SEARCH_KEYS"},
    )
