"""The ``local`` BM25 search provider: corpus formats, the on-disk index cache, bad input."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import searchr1.plugins.local_search as local_search
from searchr1.core.config import parse_config
from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.types import SearchResponse
from searchr1.kit.http import WrongEventLoop
from searchr1.plugins.local_search import LocalBM25Search

ROWS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital of France, on the Seine.'},
    {"id": "2", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"title": "Mount Kilimanjaro", "text": "Kilimanjaro is the highest mountain in Africa."},
    {"title": "Seine", "text": "The Seine is a river that flows through Paris."},
]


def write_corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def make_config(corpus: Path | str, extra: str = "", search: str = "") -> Config:
    text = f'[search]\nprovider = "local"\n{search}\n[search.local]\ncorpus = "{corpus}"\n{extra}'
    return parse_config(text, source="test.toml", env={}, registry=load_registry())


Search = Callable[..., SearchResponse]


@pytest.fixture
def search(loop: asyncio.Runner) -> Search:
    """``search(provider, query, top_k=3)``: one search in the test's one event loop."""

    def run(provider: LocalBM25Search, query: str, top_k: int = 3) -> SearchResponse:
        return loop.run(provider.search(query, top_k))

    return run


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus.jsonl", ROWS)


def test_both_row_layouts_are_searchable_with_titles_split(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))
    top = search(provider, "capital of Germany", 1)
    assert top.ok and len(top.results) == 1
    assert (top.results[0].title, top.results[0].text) == (
        "Berlin",
        "Berlin is the capital of Germany.",
    )
    plain = search(provider, "highest mountain in Africa", 2).results
    assert plain[0].title == "Mount Kilimanjaro"
    assert plain[0].score > 0


def test_top_k_limits_results_and_orders_by_score(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))
    results = search(provider, "Paris Seine river", 2).results
    assert len(results) == 2
    assert results[0].score >= results[1].score
    assert {r.title for r in results} == {"Paris", "Seine"}


def test_query_with_no_known_term_is_an_empty_success(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))
    response = search(provider, "zyxwv qwerty", 3)
    assert response.ok and response.results == ()
    assert provider.metrics()["empty_rate"] == 1.0


def test_empty_query_is_an_error_outside_the_success_rate(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))
    assert search(provider, "   \n ").error == "empty query"
    assert search(provider, "Paris", 0).error is not None
    m = provider.metrics()
    assert m["calls"] == 2 and m["invalid_queries"] == 2
    assert m["success_rate"] == 1.0 and m["errors"] == 0


def test_long_query_is_truncated_and_counted(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus, search="max_query_chars = 20"))
    response = search(provider, "capital of Germany " + "blah " * 50)
    assert response.ok and response.results[0].title == "Berlin"
    assert provider.metrics()["truncated_queries"] == 1


def test_repeated_query_is_served_from_the_cache(corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))

    async def run() -> list:
        first = await provider.search("capital of France", 2)
        second = await provider.search("  CAPITAL of   france ", 2)
        other_k = await provider.search("capital of France", 1)
        return [first, second, other_k]

    first, second, other_k = asyncio.run(run())
    assert not first.cached and second.cached and not other_k.cached
    assert second.results == first.results
    m = provider.metrics(reset=True)
    assert m["cache_hit_rate"] == pytest.approx(1 / 3)
    # a local index bills nothing: no spend counters (cache_hits, paid_calls), no HTTP ones
    assert not {"cache_hits", "paid_calls", "attempts", "http_429", "available"} & set(m)
    assert provider.metrics()["calls"] == 0


def test_cache_can_be_disabled(search: Search, corpus: Path) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus, search="cache = false"))
    search(provider, "Paris")
    assert not search(provider, "Paris").cached


def test_index_is_cached_next_to_the_corpus_and_reused(
    search: Search, corpus: Path, monkeypatch
) -> None:
    LocalBM25Search.from_config(make_config(corpus))
    assert (corpus.parent / ".corpus.jsonl.bm25" / "meta.json").is_file()

    def no_rebuild(path: Path):
        raise AssertionError("the index was rebuilt although the corpus did not change")

    monkeypatch.setattr(local_search, "_read_corpus", no_rebuild)
    provider = LocalBM25Search.from_config(make_config(corpus))
    assert search(provider, "capital of Germany", 1).results[0].title == "Berlin"


def test_index_is_rebuilt_when_the_corpus_changes(search: Search, corpus: Path) -> None:
    LocalBM25Search.from_config(make_config(corpus))
    write_corpus(corpus, ROWS + [{"title": "Lake Zorbu", "text": "Zorbu is a frozen lake."}])
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    provider = LocalBM25Search.from_config(make_config(corpus))
    assert search(provider, "frozen lake Zorbu", 1).results[0].title == "Lake Zorbu"


def test_index_goes_to_the_cache_dir_when_the_corpus_dir_is_read_only(
    search: Search, corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(local_search.os, "access", lambda path, mode: False)
    provider = LocalBM25Search.from_config(make_config(corpus))
    assert not (corpus.parent / ".corpus.jsonl.bm25").exists()
    assert list((tmp_path / "cache" / "bm25").glob("corpus.jsonl-*/meta.json"))
    assert search(provider, "Berlin").ok


def test_a_bad_row_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"name": "no text"}\n', "utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: expected a \"contents\""):
        LocalBM25Search.from_config(make_config(path))
    path.write_text("{not json\n", "utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not valid JSON"):
        LocalBM25Search.from_config(make_config(path))


def test_config_problems_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="search.local.corpus is not set"):
        LocalBM25Search.from_config(make_config(""))
    with pytest.raises(ConfigError, match="no such file"):
        LocalBM25Search.from_config(make_config(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="did you mean 'corpus'"):
        LocalBM25Search.from_config(make_config(tmp_path / "x.jsonl", extra='corpos = "y"'))


def test_a_provider_belongs_to_the_event_loop_of_its_first_search(
    search: Search, loop: asyncio.Runner, corpus: Path
) -> None:
    provider = LocalBM25Search.from_config(make_config(corpus))
    for _ in range(2):
        assert search(provider, "Paris").ok
    with pytest.raises(WrongEventLoop, match="the local search provider was first used in"):
        asyncio.run(provider.search("Paris", 3))
    assert provider.available()
    loop.run(provider.aclose())


def test_registered_as_local_through_the_entry_point() -> None:
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="searchr1")}
    assert names.get("local_search") == "searchr1.plugins.local_search"
    reg = load_registry().get("search_provider", "local")
    assert reg.plugin == "local_search"
    assert reg.settings == {"local": local_search.LocalSearchSettings}
    assert reg.default  # the search provider a file that names none gets
