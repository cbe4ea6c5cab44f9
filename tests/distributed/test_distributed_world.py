"""The pieces of :mod:`searchr1.core.distributed` that need no second process: how a draw is
split over ranks and what is refused by name (how the ranks' numbers merge:
tests/train/test_metric_schema.py)."""

from __future__ import annotations

import pytest

from searchr1.core.distributed import World, check_supported
from searchr1.core.errors import ConfigError


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_shards_are_contiguous_in_rank_order_and_differ_by_at_most_one(size: int, n: int) -> None:
    items = list(range(n))
    shards = [World(rank=r, size=size).shard(items) for r in range(size)]
    assert [x for s in shards for x in s] == items  # gathering in rank order restores the draw
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


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
