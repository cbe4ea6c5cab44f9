"""The offline demo's built-in assets: ``builtin:world/...`` and ``builtin:tiny``.

Registered through the ``searchr1`` entry point (``offline_world``) like any plugin: its
``register_assets`` hook tells :func:`searchr1.core.builtins.resolve` how to build each asset
once into the cache:

- ``world``: ``corpus.jsonl``, ``train.jsonl``, ``heldout.jsonl`` of the generated world
  (:func:`searchr1.plugins.offline_world.generate.generate_world` with seed 0; well under a second);
- ``tiny``: the warm-started tiny model (``from_pretrained``-loadable folder). The weights ship
  inside the package (``searchr1/plugins/offline_world/warm_start/``) because fine-tuning them takes far
  longer than a first run may; they are reproduced by
  ``python -m searchr1.plugins.offline_world.cold_start --shipped --out searchr1/plugins/offline_world/warm_start`` (about 20
  minutes on 2 idle cores). Without shipped weights the builder runs that recipe itself.

``world`` also offers its ceiling: the scripted ideal agent
(:mod:`searchr1.plugins.offline_world.ideal_agent`), which ``searchr1 train`` evaluates at step 0 when
``data.eval`` is ``builtin:world/...``.

Bump a version whenever its builder's output changes, so stale caches are rebuilt.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import Asset, ModelProvider
from searchr1.plugins.offline_world.generate import WORLD_SEED

__all__ = ["WORLD_SEED", "build_tiny", "build_world", "register_assets"]

WORLD_VERSION = "1"
TINY_VERSION = "2"  # 2: the shipped warm start (1 was a development build)
#: The shipped warm start: tokenizer, config and weights written by ``save_pretrained``.
SHIPPED_WARM_START = Path(__file__).with_name("warm_start")


def build_world(folder: Path) -> None:
    """Builder of ``builtin:world``: the generated world's three JSONL files."""
    from searchr1.plugins.offline_world.generate import generate_world, write_world

    write_world(Path(folder), generate_world(WORLD_SEED))


def build_tiny(folder: Path) -> None:
    """Builder of ``builtin:tiny``: copy the shipped warm start, or fine-tune one."""
    folder = Path(folder)
    if (SHIPPED_WARM_START / "config.json").is_file():
        for item in SHIPPED_WARM_START.iterdir():
            if item.is_file() and not item.name.startswith("."):
                shutil.copy2(item, folder / item.name)
        return
    from searchr1.core.logs import get_logger
    from searchr1.plugins.offline_world.cold_start import build_shipped

    get_logger().warning(
        "tiny.building", reason=f"no shipped warm start in {SHIPPED_WARM_START}", folder=str(folder)
    )
    build_shipped(folder)


def _ideal_agent(config: Any, tokenizer: Any, protocol: Any) -> ModelProvider | None:
    from searchr1.plugins.offline_world.ideal_agent import ideal_agent_for

    return ideal_agent_for(config, tokenizer, protocol)


@hookimpl
def register_assets(register: Callable[[str, Asset], None]) -> None:
    register("world", Asset(WORLD_VERSION, build_world, ceiling=_ideal_agent))
    register("tiny", Asset(TINY_VERSION, build_tiny))
