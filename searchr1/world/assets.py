"""The offline demo's built-in assets: ``builtin:world/...`` and ``builtin:tiny``.

:mod:`searchr1.core.builtins` imports this module lazily the first time a ``builtin:`` spec is
resolved; the registrations below tell it how to build each asset once into the cache:

- ``world``: ``corpus.jsonl``, ``train.jsonl``, ``heldout.jsonl`` of the generated world
  (:func:`searchr1.world.generate.generate_world` with seed 0; well under a second);
- ``tiny``: the warm-started tiny model (``from_pretrained``-loadable folder). The weights ship
  inside the package (``searchr1/world/warm_start/``) because fine-tuning them takes far
  longer than a first run may; they are reproduced by
  ``python -m searchr1.world.cold_start --shipped --out searchr1/world/warm_start`` (about 20
  minutes on 2 idle cores). Without shipped weights the builder runs that recipe itself.

Bump a version whenever its builder's output changes, so stale caches are rebuilt.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from searchr1.core.builtins import register_asset

WORLD_VERSION = "1"
TINY_VERSION = "2"  # 2: the shipped warm start (1 was a development build)
WORLD_SEED = 0
#: The shipped warm start: tokenizer, config and weights written by ``save_pretrained``.
SHIPPED_WARM_START = Path(__file__).with_name("warm_start")


def build_world(folder: Path) -> None:
    """Builder of ``builtin:world``: the generated world's three JSONL files."""
    from searchr1.world.generate import generate_world, write_world

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
    from searchr1.world.cold_start import build_shipped

    get_logger().warning(
        "tiny.building", reason=f"no shipped warm start in {SHIPPED_WARM_START}", folder=str(folder)
    )
    build_shipped(folder)


register_asset("world", WORLD_VERSION, f"{__name__}:build_world")
register_asset("tiny", TINY_VERSION, f"{__name__}:build_tiny")
