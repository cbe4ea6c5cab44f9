"""The pieces of :mod:`searchr1.core.distributed` that need no second process: how a draw is
split over ranks, how the ranks' search metrics merge, and what is refused by name."""

from __future__ import annotations

import pytest

from searchr1.core.distributed import World, check_supported, merge_search_metrics
from searchr1.core.errors import ConfigError


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_shards_are_contiguous_in_rank_order_and_differ_by_at_most_one(size: int, n: int) -> None:
    items = list(range(n))
    shards = [World(rank=r, size=size).shard(items) for r in range(size)]
    assert [x for s in shards for x in s] == items  # gathering in rank order restores the draw
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_search_metrics_of_the_ranks_merge_as_one_provider_would_count() -> None:
    a = {"calls": 3.0, "errors": 1.0, "success_rate": 2 / 3, "latency_p50": 0.1, "available": 1.0}
    b = {"calls": 1.0, "errors": 0.0, "success_rate": 1.0, "latency_p50": 0.5, "available": 0.0}
    merged = merge_search_metrics([a, b])
    assert merged["calls"] == 4.0 and merged["errors"] == 1.0
    assert merged["success_rate"] == pytest.approx(3 / 4)  # 3 of the 4 calls answered
    assert merged["latency_p50"] == pytest.approx(0.2)  # weighted by calls
    assert merged["available"] == 0.0  # one rank's provider down: the job's is
    assert merge_search_metrics([a]) == a


def test_what_several_processes_cannot_do_is_refused_naming_the_setting() -> None:
    check_supported(World(), max_staleness=2, data_parallel=False, provider="remote")
    with pytest.raises(ConfigError) as err:
        check_supported(World(0, 2), max_staleness=2, data_parallel=False, provider="remote")
    assert "train.max_staleness = 2" in str(err.value)
    assert "model.provider = 'remote'" in str(err.value)


def test_a_malformed_torchrun_environment_names_the_variables() -> None:
    assert World.from_env({}) == World()
    with pytest.raises(ConfigError, match="RANK / WORLD_SIZE / LOCAL_RANK"):
        World.from_env({"WORLD_SIZE": "two", "RANK": "0"})
    with pytest.raises(ConfigError, match="RANK = 5 is outside 0..1"):
        World.from_env({"WORLD_SIZE": "2", "RANK": "5"})
