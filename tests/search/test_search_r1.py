"""The ``search_r1`` provider (Search-R1 retrieval server client) against the loopback fake:
batching of concurrent queries, parsing, and failures shared by a batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from search_fakes import RETRIEVE_PATH, FakeSearchServer, start_fake_retriever

from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.kit.search.http_provider import ResponseError
from searchr1.plugins.search_r1_retriever import SearchR1Retriever, parse_retrieve


def make_provider(base_url: str, own: str = "batch_window_ms = 50", keys: str = "", **search):
    fields = {"timeout_seconds": 2, "max_retries": 1, **search}
    lines = "".join(f"{k} = {v}\n" for k, v in fields.items())
    key_line = f'api_keys = "{keys}"\n' if keys else ""
    text = (
        f'[search]\nprovider = "search_r1"\napi_base = "{base_url}"\n{key_line}{lines}'
        f"[search.search_r1]\n{own}\n"
    )
    return SearchR1Retriever(
        parse_config(text, source="t.toml", env={}, registry=load_registry()), backoff_base_s=0.01
    )


def gather(provider: SearchR1Retriever, queries: list[str], top_k: int = 2) -> list:
    async def go() -> list:
        try:
            return await asyncio.gather(*(provider.search(q, top_k) for q in queries))
        finally:
            await provider.aclose()

    return asyncio.run(go())


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeSearchServer]]:
    with start_fake_retriever() as served:
        yield served


def test_concurrent_queries_go_in_one_request_and_map_back_in_order(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url)
    queries = [f"query {i}" for i in range(10)]
    responses = gather(provider, queries)
    (record,) = server.records
    assert record.path == RETRIEVE_PATH and record.queries == tuple(queries)
    assert record.params == {"topk": "2", "return_scores": "true"}
    assert record.key is None  # no keys configured: no Authorization header
    for query, response in zip(queries, responses, strict=True):
        assert response.ok and len(response.results) == 2
        top = response.results[0]
        assert (top.title, top.text, top.score) == (f"{query} title 0", f"{query} text 0", 2.0)
    m = provider.metrics()
    assert (m["calls"], m["attempts"], m["success_rate"]) == (10, 1, 1)


def test_batches_are_split_at_max_batch_and_by_top_k(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url, own="batch_window_ms = 50\nmax_batch = 4")

    async def go() -> None:
        await asyncio.gather(
            *(provider.search(f"q{i}", 2) for i in range(10)),
            provider.search("other k", 5),
        )
        await provider.aclose()

    asyncio.run(go())
    sizes = sorted(len(r.queries) for r in server.records if r.params["topk"] == "2")
    assert sizes == [2, 4, 4]
    assert [r.queries for r in server.records if r.params["topk"] == "5"] == [("other k",)]


def test_sequential_queries_are_sent_one_by_one(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url, own="batch_window_ms = 1")

    async def go() -> None:
        for q in ("a", "b"):
            assert (await provider.search(q, 3)).ok
        await provider.aclose()

    asyncio.run(go())
    assert [r.queries for r in server.records] == [("a",), ("b",)]


def test_identical_concurrent_queries_are_sent_once(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url)
    responses = gather(provider, ["same q"] * 5 + ["other"])
    (record,) = server.records
    assert sorted(record.queries) == ["other", "same q"]
    assert sum(r.cached for r in responses) == 4


def test_a_failed_request_fails_its_whole_batch_after_retries(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["503", "503"]
    provider = make_provider(base_url)
    responses = gather(provider, ["a", "b", "c"])
    assert [r.error for r in responses] == ["server error (HTTP 503)"] * 3
    m = provider.metrics()
    assert (m["attempts"], m["retries"], m["errors"], m["error_rate"]) == (2, 1, 3, 1)
    assert provider.available()


def test_a_wrong_shape_answer_is_a_malformed_error(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["wrong_shape"]
    provider = make_provider(base_url)
    responses = gather(provider, ["a", "b"])
    assert {r.error for r in responses} == {
        "malformed response (expected one result list per query)"
    }
    assert provider.metrics()["malformed_responses"] == 1


def test_keys_are_sent_and_a_rejected_only_key_means_down(fake) -> None:
    base_url, server = fake
    server.behaviour.key_status = {"gateway-key-xyz": 403}
    provider = make_provider(base_url, keys="gateway-key-xyz")
    (response,) = gather(provider, ["a"])
    assert response.error == "search API key rejected (403)"
    assert server.records[0].key == "gateway-key-xyz"
    assert not provider.available()
    assert "gateway-key-xyz" not in repr(provider.metrics()) + repr(response)


def test_parse_accepts_bare_documents_and_rejects_missing_contents() -> None:
    request = httpx.Request("POST", "http://x/retrieve")
    bare = httpx.Response(
        200,
        json={"result": [[{"id": "1", "contents": '"T"\nbody'}, {"title": "U", "text": "v"}]]},
        request=request,
    )
    (results,) = parse_retrieve(bare, 1, 3)
    assert [(r.title, r.text, r.score) for r in results] == [("T", "body", 0.0), ("U", "v", 0.0)]
    broken = httpx.Response(200, json={"result": [[{"document": {"id": "1"}}]]}, request=request)
    with pytest.raises(ResponseError, match="no contents"):
        parse_retrieve(broken, 1, 3)
    not_json = httpx.Response(200, content=b"oops", request=request)
    with pytest.raises(ResponseError, match="not JSON"):
        parse_retrieve(not_json, 1, 3)


def test_own_table_is_checked() -> None:
    text = '[search]\nprovider = "search_r1"\n[search.search_r1]\nbatch_windo_ms = 3\n'
    with pytest.raises(ConfigError, match="did you mean 'batch_window_ms'"):
        SearchR1Retriever(parse_config(text, source="t.toml", env={}, registry=load_registry()))
