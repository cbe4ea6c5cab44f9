"""The ``offline_world`` plugin: the offline demo's generated world and its tiny model.

Registered through the ``searchr1`` entry point (``offline_world``) like any third-party
plugin. It registers assets. The assets are what the embedded default
config (``searchr1 train`` with no ``--config``) names:

- ``builtin:world/{corpus,train,heldout}.jsonl``: the generated world, with its ceiling (the
  scripted ideal agent; ``train`` evaluates it once before the first step);
- ``builtin:world-hard/{corpus,train,heldout,cold_start}.jsonl``: the harder world
  (``examples/real-model-hard.toml``), with its own ideal agent as ceiling;
- ``builtin:tiny``: the warm-started tiny model the demo trains;
- ``builtin:tiny-random``: the same architecture with random weights and a tokenizer trained
  on built-in text, which tests and benchmarks load through any model provider.

Importing this package stays cheap (the hook runs at every start-up): torch, transformers and
tokenizers are imported only when an asset is built. The ``local`` model provider does not
import this package; it opens ``builtin:`` paths through :mod:`searchr1.core.assets`.

Modules, in the order a build uses them:

- ``assets``: each asset's version and builder (what ends up in the cache folder);
- ``generate``: the world of fictional entities, its corpus and question sets;
- ``hard_world``: the harder world, one question type per search behaviour;
- ``tiny_model``: tokenizer and Qwen3 model builders (also used by tests and benchmarks);
- ``ideal_agent``: the world's ceiling (``python scripts/ideal_agent.py`` evaluates it alone).

``warm_start/`` holds the shipped weights of ``builtin:tiny``; ``scripts/build_warm_start.py``
(not part of the package) is the recipe that made them.
"""

from __future__ import annotations

from searchr1.core.hookspecs import Register, hookimpl
from searchr1.core.types import Asset


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

    register("world", Asset(WORLD_VERSION, build_world, ceiling=ideal_agent_for))
    register(
        "world-hard", Asset(HARD_WORLD_VERSION, build_hard_world, ceiling=hard_ideal_agent_for)
    )
    register("tiny", Asset(TINY_VERSION, build_tiny))
    register("tiny-random", Asset(TINY_RANDOM_VERSION, build_tiny_random))
