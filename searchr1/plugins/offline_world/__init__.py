"""The ``offline_world`` plugin: the offline demo's generated world and its tiny model.

Registered through the ``searchr1`` entry point (``offline_world``) like any third-party
plugin. It registers assets. The assets are what the embedded default
config (``searchr1 train`` with no ``--config``) names.
"""

from __future__ import annotations

from searchr1.sdk import Asset, Register, hookimpl


@hookimpl
def register_assets(register: Register[Asset]) -> None:
    from searchr1.plugins.offline_world.assets import (
        HARD_WORLD_VERSION,
        TINY_RANDOM_VERSION,
        TINY_VERSION,
        WORLD_VERSION,
        build_hard_world,
        build_tiny,
        build_tiny_random,
        build_world,
    )
    from searchr1.plugins.offline_world.ideal_agent import hard_ideal_agent_for, ideal_agent_for

    register(
        "world",
        Asset(WORLD_VERSION, build_world, ceiling=ideal_agent_for, takes="under a second; 1 MB"),
    )
    register(
        "world-hard",
        Asset(
            HARD_WORLD_VERSION,
            build_hard_world,
            ceiling=hard_ideal_agent_for,
            takes="about a second; 1 MB",
        ),
    )
    register("tiny", Asset(TINY_VERSION, build_tiny, takes="about a second; 5 MB"))
    register(
        "tiny-random", Asset(TINY_RANDOM_VERSION, build_tiny_random, takes="a few seconds; 4 MB")
    )
