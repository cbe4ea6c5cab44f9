"""The ``zhihu`` provider and the shared HTTP reliability layer, against a real loopback
server (``search_fakes``) that injects 429s, rejected keys, 5xx bursts, timeouts, malformed
bodies and ``Code != 0``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from search_fakes import ZHIHU_PATH, FakeSearchServer, start_fake_zhihu
from structlog.testing import capture_logs

from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.kit.http import WrongEventLoop
from searchr1.kit.search.http_provider import ERR_DOWN, ERR_QUOTA
from searchr1.plugins.zhihu_search import ZhihuSearch

KEYS = ["zk-alpha-0000-secret", "zk-bravo-1111-secret", "zk-charlie-2222-secret"]


def make_provider(base_url: str, keys: list[str] = KEYS, zhihu: str = "", **search) -> ZhihuSearch:
    """A provider for the fake at ``base_url``; ``search`` overrides ``[search]`` fields."""
    fields = {"timeout_seconds": 2, "max_retries": 2, **search}
    lines = "".join(f"{k} = {v}\n" for k, v in fields.items())
    text = (
        '[search]\nprovider = "zhihu"\napi_keys = "${ZHIHU_SEARCH_KEYS}"\n'
        f'api_base = "{base_url}"\n{lines}[search.zhihu]\n{zhihu}\n'
    )
    config = parse_config(
        text,
        source="test.toml",
        env={"ZHIHU_SEARCH_KEYS": ",".join(keys)},
        registry=load_registry(),
    )
    return ZhihuSearch(config, backoff_base_s=0.01)


def run_queries(provider: ZhihuSearch, queries: list[str], top_k: int = 3) -> list:
    async def go() -> list:
        try:
            return [await provider.search(q, top_k) for q in queries]
        finally:
            await provider.aclose()

    return asyncio.run(go())


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeSearchServer]]:
    with start_fake_zhihu() as served:
        yield served


def test_keys_are_used_round_robin_and_items_are_mapped(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url)
    responses = run_queries(provider, [f"question {i}" for i in range(4)], top_k=2)
    assert server.keys_served() == [KEYS[0], KEYS[1], KEYS[2], KEYS[0]]
    first = responses[0]
    assert first.ok and len(first.results) == 2
    hit = first.results[0]
    assert hit.title == "question 0 answer 0"  # <em> highlight removed
    assert hit.text == "Text 0 about question 0 & more."  # entity unescaped
    assert hit.url == "https://www.zhihu.com/answer/0"
    assert hit.score > first.results[1].score
    assert server.records[0].path == ZHIHU_PATH
    assert server.records[0].params["Count"] == "2"
    m = provider.metrics()
    assert (m["calls"], m["attempts"], m["success_rate"], m["results_per_call"]) == (4, 4, 1, 2)
    assert server.connections == 1  # four searches, one keep-alive connection


def test_count_is_capped_at_20_and_search_db_is_sent(fake) -> None:
    base_url, server = fake
    provider = make_provider(base_url, zhihu='search_db = "realtime"')
    (response,) = run_queries(provider, ["many"], top_k=50)
    assert server.records[0].params["Count"] == "20"
    assert server.records[0].params["SearchDB"] == "realtime"
    assert len(response.results) == 20


def test_a_429_benches_the_key_and_the_request_moves_on(fake) -> None:
    base_url, server = fake
    server.behaviour.key_status = {KEYS[1]: 429}
    provider = make_provider(base_url)
    with capture_logs() as logs:
        responses = run_queries(provider, ["a", "b", "c", "d"])
    assert all(r.ok for r in responses)
    assert [(r.key, r.status) for r in server.records] == [
        (KEYS[0], 200),
        (KEYS[1], 429),
        (KEYS[2], 200),
        (KEYS[0], 200),
        (KEYS[2], 200),
    ]
    m = provider.metrics()
    assert (m["attempts"], m["http_429"], m["retries"]) == (5, 1, 0)
    assert m["429_rate"] == pytest.approx(1 / 5)
    assert m["keys_available"] == 2 and m["available"] == 1
    benched = [e for e in logs if e["event"] == "search_key_benched"]
    assert [(e["key_index"], e.get("benched_for")) for e in benched] == [(1, "the run")]
    assert "benched_for_s" not in benched[0]  # no "None" on the console


def test_retry_after_on_429_sets_the_cool_down(fake) -> None:
    base_url, server = fake
    server.behaviour.retry_after = "0.2"
    server.behaviour.script = ["429"]
    provider = make_provider(base_url, keys=KEYS[:2])

    async def go() -> tuple[float, float]:
        await provider.search("x", 3)
        during = provider.metrics()["keys_available"]
        await asyncio.sleep(0.3)
        return during, provider.metrics()["keys_available"]

    during, after = asyncio.run(go())
    assert server.keys_served(429) == [KEYS[0]] and server.keys_served() == [KEYS[1]]
    assert (during, after) == (1, 2)


def test_a_rejected_key_is_benched_for_the_run_and_logged_by_index(fake) -> None:
    base_url, server = fake
    server.behaviour.key_status = {KEYS[0]: 401}
    provider = make_provider(base_url)
    with capture_logs() as logs:
        responses = run_queries(provider, ["a", "b", "c"])
    assert all(r.ok for r in responses)
    assert server.keys_served(401) == [KEYS[0]]
    assert server.keys_served() == [KEYS[1], KEYS[2], KEYS[1]]
    (event,) = [e for e in logs if e["event"] == "search_key_benched"]
    assert event["key_index"] == 0 and "401" in event["reason"]
    assert provider.metrics()["auth_errors"] == 1


def test_every_key_out_of_quota_means_the_environment_is_down(fake) -> None:
    base_url, server = fake
    server.behaviour.all_status = 429
    provider = make_provider(base_url)
    with capture_logs() as logs:
        first, second = run_queries(provider, ["a", "b"])
    assert first.error == ERR_QUOTA
    assert second.error == ERR_DOWN
    assert len(server.records) == 3  # each key tried once; then no request at all
    assert not provider.available()
    m = provider.metrics()
    assert (m["available"], m["keys_available"], m["error_rate"], m["unavailable"]) == (0, 0, 1, 1)
    assert any(e["event"] == "search_environment_down" for e in logs)


def test_keys_throttled_for_a_few_seconds_are_not_a_down_environment(fake) -> None:
    """Every key answered 429 with ``Retry-After: 2``: the service is throttling, so the
    step guard must not read it as down (it would hold the update back for 30 s and more);
    a 429 with a Retry-After past what the provider waits out is a down environment."""
    base_url, server = fake
    server.behaviour.all_status = 429
    server.behaviour.retry_after = "2"
    provider = make_provider(base_url, max_retries=0)
    first, *_ = run_queries(provider, ["a", "b", "c"])
    assert first.error == ERR_QUOTA
    assert provider.metrics()["keys_available"] == 0  # every key benched right now
    assert provider.available()
    server.behaviour.retry_after = "3600"
    provider = make_provider(base_url, max_retries=0)
    run_queries(provider, ["a", "b", "c"])
    assert not provider.available()


def test_a_5xx_burst_is_retried_with_backoff(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["503", "502"]
    provider = make_provider(base_url)
    (response,) = run_queries(provider, ["q"])
    assert response.ok
    assert [r.status for r in server.records] == [503, 502, 200]
    m = provider.metrics()
    assert (m["attempts"], m["retries"], m["server_errors"], m["errors"]) == (3, 2, 2, 0)
    assert provider.metrics()["keys_available"] == 3  # a 5xx is not the key's fault


def test_retries_stop_at_max_retries(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["500"] * 5
    provider = make_provider(base_url)
    (response,) = run_queries(provider, ["q"])
    assert response.error == "server error (HTTP 500)"
    assert len(server.records) == 3
    m = provider.metrics()
    assert (m["retries"], m["errors"], m["success_rate"]) == (2, 1, 0)


def test_retry_after_on_5xx_is_honoured(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["503"]
    server.behaviour.retry_after = "0.3"
    provider = make_provider(base_url)
    (response,) = run_queries(provider, ["q"])
    assert response.ok
    first, second = server.records
    assert second.started - first.finished >= 0.25  # backoff alone would be ~0.01 s


def test_a_slow_response_times_out_and_is_retried(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["slow"]
    server.behaviour.slow_s = 4.0
    # 1.5 s, not less: on a loaded 2-core machine the fast retry itself can take ~0.5 s
    provider = make_provider(base_url, timeout_seconds=1.5)
    (response,) = run_queries(provider, ["q"])
    assert response.ok
    m = provider.metrics()
    assert (m["timeouts"], m["attempts"], m["retries"]) == (1, 2, 1)
    assert m["timeout_rate"] == 0.5


def test_timeout_without_retries_is_a_timeout_error(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["slow"]
    server.behaviour.slow_s = 3.0
    provider = make_provider(base_url, timeout_seconds=0.5, max_retries=0)
    (response,) = run_queries(provider, ["q"])
    assert response.error == "timeout"
    assert provider.metrics()["timeout_rate"] == 1.0


@pytest.mark.parametrize(
    ("action", "counter"),
    [
        ("malformed", "malformed_responses"),
        ("wrong_shape", "malformed_responses"),
        ("code", "api_errors"),
    ],
)
def test_an_unusable_200_is_asked_again_with_the_next_key(fake, action, counter) -> None:
    base_url, server = fake
    server.behaviour.script = [action]
    provider = make_provider(base_url)
    first, second = run_queries(provider, ["q1", "q2"])
    assert first.ok and second.ok  # the failure on one key did not reach the trajectory
    assert [(r.key, r.action) for r in server.records[:2]] == [(KEYS[0], action), (KEYS[1], "ok")]
    m = provider.metrics()
    assert (m[counter], m["key_retries"], m["errors"], m["attempts"], m["retries"]) == (
        1, 1, 0, 3, 0,
    )  # fmt: skip
    assert m["paid_calls"] == 3 and provider.available()


@pytest.mark.parametrize(
    ("action", "error", "counter"),
    [
        ("malformed", "malformed response (not JSON)", "malformed_responses"),
        ("code", "search API error (Code 1001: success)", "api_errors"),
        ("404", "request rejected (HTTP 404)", "http_errors"),
    ],
)
def test_an_unusable_answer_from_every_key_is_an_error(fake, action, error, counter) -> None:
    base_url, server = fake
    tries = 1 if action == "404" else 3  # a 404 is the request's fault, not the key's
    server.behaviour.script = [action] * tries
    provider = make_provider(base_url)
    first, second = run_queries(provider, ["q1", "q2"])
    assert first.error == error and first.results == ()
    assert second.ok  # the next call is unaffected
    m = provider.metrics()
    assert (m[counter], m["errors"], m["attempts"]) == (tries, 1, tries + 1)
    assert m["error_rate"] == 0.5 and m["keys_available"] == 3  # nobody else worked: no bench


def test_a_dead_key_is_benched_probed_after_its_cool_down_and_restored(fake) -> None:
    base_url, server = fake
    server.behaviour.key_action = {KEYS[1]: "code"}  # an API error inside every 200
    provider = make_provider(base_url, key_max_failures=2, key_probe_seconds=0.3)

    async def go() -> list:
        out = [await provider.search(f"a{i}", 3) for i in range(6)]
        served = len(server.records)
        out += [await provider.search(f"b{i}", 3) for i in range(4)]
        assert KEYS[1] not in [r.key for r in server.records[served:]]  # benched: not asked
        await asyncio.sleep(0.4)  # the cool-down ends: probed, fails, benched for twice as long
        out += [await provider.search(f"c{i}", 3) for i in range(3)]
        server.behaviour.key_action = {}  # the key works again
        await asyncio.sleep(0.7)
        served = len(server.records)
        out += [await provider.search(f"d{i}", 3) for i in range(3)]
        assert KEYS[1] in server.keys_served()[-3:]  # back in rotation
        await provider.aclose()
        return out

    with capture_logs() as logs:
        responses = asyncio.run(go())
    assert all(r.ok for r in responses)  # every failure on the dead key was retried elsewhere
    moves = [(e["event"], e["key_index"]) for e in logs if e["event"].startswith("search_key_")]
    assert moves == [
        ("search_key_benched", 1),
        ("search_key_unbenched", 1),
        ("search_key_benched", 1),
        ("search_key_unbenched", 1),
        ("search_key_healthy", 1),
    ]
    benched = [e for e in logs if e["event"] == "search_key_benched"]
    assert [e["benched_for_s"] for e in benched] == [0.3, 0.6]
    assert "Code 1001" in benched[0]["reason"]
    m = provider.metrics()
    assert m["errors"] == 0 and m["keys_available"] == 3
    seen = repr(logs)
    assert not any(key in seen for key in KEYS)


def test_failures_every_key_shares_bench_no_key(fake) -> None:
    base_url, server = fake
    server.behaviour.code = 1001  # the service itself answers API errors
    provider = make_provider(base_url, key_max_failures=1)
    with capture_logs() as logs:
        responses = run_queries(provider, [f"q{i}" for i in range(4)])
    assert all(not r.ok for r in responses)
    assert not any(e["event"] == "search_key_benched" for e in logs)
    assert provider.metrics()["keys_available"] == 3


def test_calls_per_key_cost_and_answers_kept_on_disk_for_the_next_run(fake) -> None:
    base_url, server = fake
    queries = ["Who wrote X?", "where is lyon", "a b c"]
    first = make_provider(base_url, cost_per_call=0.015)
    run_queries(first, queries)
    m = first.metrics(reset=True)
    assert [m["key_calls/0"], m["key_calls/1"], m["key_calls/2"]] == [1, 1, 1]
    assert (m["paid_calls"], m["disk_hits"], m["cost"]) == (3, 0, pytest.approx(0.045))

    again = make_provider(base_url, cost_per_call=0.015)  # a rerun: a new provider
    responses = run_queries(again, ["  who WROTE x? ", *queries[1:], "new one"])
    assert all(r.ok for r in responses) and all(r.cached for r in responses[:3])
    assert [r.queries for r in server.records[3:]] == [("new one",)]  # only the new query paid
    m = again.metrics()
    assert (m["paid_calls"], m["disk_hits"], m["cache_hit_rate"]) == (1, 3, 0.75)
    assert m["cost"] == pytest.approx(0.015) and m["cost_total"] == pytest.approx(0.015)

    other_top_k = make_provider(base_url)
    run_queries(other_top_k, queries[:1], top_k=2)  # another top_k is another answer
    off = make_provider(base_url, disk_cache="false")
    run_queries(off, queries[:1])
    assert len(server.records) == 6
    no_run_cache = make_provider(base_url, cache="false")  # the disk still answers
    assert run_queries(no_run_cache, queries[1:2])[0].cached
    assert len(server.records) == 6

    from searchr1.kit.search.cache import answer_store_path

    stored = b"".join(f.read_bytes() for f in answer_store_path().rglob("*") if f.is_file())
    assert b"where is lyon" in stored
    assert not any(key.encode() in stored for key in KEYS)


def test_answers_older_than_the_ttl_are_asked_again(fake) -> None:
    base_url, server = fake
    run_queries(make_provider(base_url, cache_ttl_hours=0.0001), ["q"])
    import time

    time.sleep(0.5)  # 0.36 s is the ttl
    run_queries(make_provider(base_url, cache_ttl_hours=0.0001), ["q"])
    assert len(server.records) == 2


def test_a_dropped_connection_is_retried(fake) -> None:
    base_url, server = fake
    server.behaviour.script = ["drop"]
    provider = make_provider(base_url)
    (response,) = run_queries(provider, ["q"])
    assert response.ok
    assert provider.metrics()["connection_errors"] == 1


def test_no_server_at_all_is_a_connection_error() -> None:
    with start_fake_zhihu() as (base_url, _):
        pass  # the port is closed again
    provider = make_provider(base_url, max_retries=1)
    (response,) = run_queries(provider, ["q"])
    assert response.error == "connection error"
    assert provider.metrics()["connection_errors"] == 2


def test_empty_result_list_is_a_success_with_no_results(fake) -> None:
    base_url, server = fake
    server.behaviour.results = 0
    provider = make_provider(base_url)
    (response,) = run_queries(provider, ["q"])
    assert response.ok and response.results == ()
    assert provider.metrics()["empty_rate"] == 1.0


def test_repeated_and_concurrent_identical_queries_hit_the_service_once(fake) -> None:
    base_url, server = fake
    server.behaviour.latency_s = 0.05
    provider = make_provider(base_url)

    async def go() -> list:
        same = await asyncio.gather(*(provider.search("Who wrote X?", 3) for _ in range(8)))
        again = await provider.search("  who WROTE x? ", 3)
        await provider.aclose()
        return [*same, again]

    responses = asyncio.run(go())
    assert len(server.records) == 1
    assert all(r.ok and r.results == responses[0].results for r in responses)
    assert sum(r.cached for r in responses) == 8
    assert provider.metrics()["cache_hit_rate"] == pytest.approx(8 / 9)


def test_the_concurrency_limit_holds_at_the_server(fake) -> None:
    base_url, server = fake
    server.behaviour.latency_s = 0.05
    provider = make_provider(base_url, max_concurrency=4)

    async def go() -> list:
        out = await asyncio.gather(*(provider.search(f"q{i}", 3) for i in range(24)))
        await provider.aclose()
        return out

    responses = asyncio.run(go())
    assert all(r.ok for r in responses) and len(server.records) == 24
    assert 1 < server.max_in_flight <= 4
    assert server.connections <= 4  # the pool reuses its connections


def test_no_key_ever_appears_in_logs_errors_or_metrics(fake, capsys) -> None:
    base_url, server = fake
    server.behaviour.key_status = {KEYS[0]: 401, KEYS[1]: 429}
    server.behaviour.message = "bad token {key}"  # the service echoes the key back
    server.behaviour.script = ["code", "503", "malformed"]
    provider = make_provider(base_url)

    async def go() -> list:
        try:
            responses = [await provider.search(q, 3) for q in ["a", "b", "c", "d"]]
            server.behaviour.all_status = 429
            return responses + [await provider.search(q, 3) for q in ["e", "f"]]
        finally:
            await provider.aclose()

    with capture_logs() as logs:
        responses = asyncio.run(go())
    seen = repr(logs) + repr(responses) + repr(provider.metrics()) + repr(provider.settings)
    captured = capsys.readouterr()
    seen += captured.out + captured.err
    assert "Code 1001" in seen  # the API error did happen...
    for key in KEYS:
        assert key not in seen  # ...but no key was ever shown


def test_config_requires_keys_and_checks_its_table(fake) -> None:
    base_url, _ = fake
    text = (
        f'[search]\nprovider = "zhihu"\napi_base = "{base_url}"\n[search.zhihu]\nsearch_db = "x"\n'
    )
    config = parse_config(text, source="t.toml", env={}, registry=load_registry())
    with pytest.raises(ConfigError) as err:
        ZhihuSearch(config)
    assert "search.api_keys is empty" in str(err.value)
    assert "search.zhihu.search_db" in str(err.value)


def test_default_api_base_is_zhihu() -> None:
    config = parse_config(
        '[search]\napi_keys = "k-123456"\n', source="t.toml", env={}, registry=load_registry()
    )
    assert ZhihuSearch(config).api_base == "https://developer.zhihu.com"


def test_a_provider_belongs_to_the_event_loop_of_its_first_search(fake, loop) -> None:
    base_url, server = fake
    provider = make_provider(base_url)
    assert loop.run(provider.search("one", 3)).ok
    assert loop.run(provider.search("two", 3)).ok  # the same loop, its pool reused
    with pytest.raises(WrongEventLoop, match="the zhihu search provider was first used in"):
        asyncio.run(provider.search("three", 3))  # a second loop: an error, not a new pool
    assert len(server.records) == 2 and server.connections == 1
    loop.run(provider.aclose())


def test_an_answer_store_that_cannot_be_written_is_turned_off_with_one_warning(
    fake, tmp_path, monkeypatch
) -> None:
    base_url, server = fake
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SEARCHR1_SEARCH_CACHE", str(blocker / "answers"))
    provider = make_provider(base_url)
    with capture_logs() as logs:
        responses = run_queries(provider, ["q1", "q2"])
    assert all(r.ok for r in responses) and len(server.records) == 2
    (off,) = [e for e in logs if e["event"] == "search_disk_cache_off"]
    assert off["path"] == str(blocker / "answers") and "SEARCHR1_SEARCH_CACHE" in off["hint"]


def test_a_damaged_answer_store_is_discarded_with_a_warning_and_started_again(
    fake, _search_answer_store: Path
) -> None:
    base_url, server = fake
    assert all(r.ok for r in run_queries(make_provider(base_url), ["q1", "q2"]))
    database = _search_answer_store / "cache.db"
    assert database.stat().st_size > 0 and len(server.records) == 2
    with database.open("r+b") as fh:  # the file's header overwritten
        fh.write(b"\0" * 100)
    with capture_logs() as logs:
        assert all(r.ok for r in run_queries(make_provider(base_url), ["q1"]))
    (damaged,) = [e for e in logs if e["event"] == "search_disk_cache_damaged"]
    assert damaged["log_level"] == "warning" and damaged["path"] == str(database)
    assert "not a database" in damaged["error"] and "discarded" in damaged["action"]
    assert not [e for e in logs if e["event"] == "search_disk_cache_off"]
    assert len(server.records) == 3  # asked again: the damaged file answered nothing
    again = make_provider(base_url)
    assert all(r.ok for r in run_queries(again, ["q1"]))
    assert len(server.records) == 3 and again.metrics()["disk_hits"] == 1  # kept again


def _old_answer_file(path: Path) -> None:
    """The single SQLite file an earlier version kept answers (and verdicts) in."""
    import sqlite3

    db = sqlite3.connect(path)
    with db:
        db.execute(
            "CREATE TABLE answers (provider TEXT NOT NULL, endpoint TEXT NOT NULL, query TEXT "
            "NOT NULL, top_k INTEGER NOT NULL, results TEXT NOT NULL, stored REAL NOT NULL, "
            "PRIMARY KEY (provider, endpoint, query, top_k))"
        )
        db.execute("INSERT INTO answers VALUES ('zhihu', 'x', 'q1', 3, '[]', 0)")
    db.close()


@pytest.mark.parametrize("where", ["the configured path", "next to the folder"])
def test_an_earlier_versions_answer_file_is_removed_with_a_warning_and_a_folder_started(
    fake, _search_answer_store: Path, where: str
) -> None:
    base_url, server = fake
    old = _search_answer_store
    if where == "next to the folder":  # the default folder is search/answers: search/answers.sqlite
        old = old.with_name(f"{old.name}.sqlite")
    _old_answer_file(old)
    with capture_logs() as logs:
        assert all(r.ok for r in run_queries(make_provider(base_url), ["q1"]))
    (warned,) = [e for e in logs if e["event"] == "search_disk_cache_old_format"]
    assert warned["log_level"] == "warning" and warned["path"] == str(old)
    assert "earlier version" in warned["action"] and str(_search_answer_store) in warned["action"]
    assert not old.is_file() and _search_answer_store.is_dir()
    assert [e["event"] for e in logs if "disk_cache" in e["event"]] == [warned["event"]]
    again = make_provider(base_url)  # the new folder keeps answers again
    assert all(r.ok for r in run_queries(again, ["q1"]))
    assert len(server.records) == 1 and again.metrics()["disk_hits"] == 1


def _someones_database(path: Path) -> bytes:
    """An SQLite file of someone else's: an ``answers`` table beside one of its own."""
    import sqlite3

    db = sqlite3.connect(path)
    with db:
        db.execute("CREATE TABLE answers (id INTEGER)")
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ada')")
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("what", ["a database at the path", "a database next to it", "a folder"])
def test_what_is_not_a_search_cache_is_never_removed_nor_written_to(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A mistyped ``SEARCHR1_SEARCH_CACHE``: someone's database or folder stays as it was;
    the store is off for the run with one warning (at the path) and the searches go on."""
    base_url, server = fake
    given = tmp_path / "mine"
    kept: dict[Path, bytes] = {}
    if what == "a database at the path":
        kept[given] = _someones_database(given)
    elif what == "a database next to it":
        neighbour = given.with_name("mine.sqlite")
        kept[neighbour] = _someones_database(neighbour)
    else:
        given.mkdir()
        (given / "cache.db").write_bytes(b"my notes, not a database")
        (given / "thesis.tex").write_text("\\section{x}")
        kept = {f: f.read_bytes() for f in given.iterdir()}
    monkeypatch.setenv("SEARCHR1_SEARCH_CACHE", str(given))
    with capture_logs() as logs:
        provider = make_provider(base_url)
        assert all(r.ok for r in run_queries(provider, ["q1", "q1"]))
    events = [e for e in logs if "disk_cache" in e["event"]]
    if what == "a database next to it":  # not the store's: left alone, the folder made
        assert events == [] and given.is_dir() and provider.metrics()["disk_hits"] == 0
    else:
        (off,) = events
        assert off["event"] == "search_disk_cache_off" and off["path"] == str(given)
        assert "left as it is" in off["error"] and "SEARCHR1_SEARCH_CACHE" in off["hint"]
        assert len(server.records) == 1  # the run's own cache still answers the repeat
    for path, content in kept.items():
        assert path.read_bytes() == content, path
    if what == "a folder":
        assert sorted(p.name for p in given.iterdir()) == ["cache.db", "thesis.tex"]
