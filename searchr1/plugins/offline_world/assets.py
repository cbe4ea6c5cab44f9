"""The offline world's built-in assets: each one's version and builder.

A builder runs once, into an empty cache folder, the first time a path of its asset is
opened.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from searchr1.plugins.offline_world.generate import WORLD_SEED

WORLD_VERSION = "1"
HARD_WORLD_VERSION = "1"
TINY_VERSION = "2"  # 2: the shipped warm start (1 was a development build)
TINY_RANDOM_VERSION = "1"
#: The shipped warm start: tokenizer, config and weights written by ``save_pretrained``.
SHIPPED_WARM_START = Path(__file__).with_name("warm_start")


def build_world(folder: Path) -> None:
    """Builder of ``builtin:world``: the generated world's three JSONL files."""
    from searchr1.plugins.offline_world.generate import generate_world, write_world

    write_world(Path(folder), generate_world(WORLD_SEED))


def build_hard_world(folder: Path) -> None:
    """Builder of ``builtin:world-hard``: the harder world's corpus and question sets."""
    from searchr1.plugins.offline_world.hard_world import generate_hard_world, write_hard_world

    write_hard_world(Path(folder), generate_hard_world())


def build_tiny(folder: Path) -> None:
    """Builder of ``builtin:tiny``: a copy of the shipped warm start. An installation without
    it is broken: :class:`~searchr1.core.errors.SearchR1Error` says so and how to mend it."""
    if not (SHIPPED_WARM_START / "config.json").is_file():
        from searchr1.sdk import SearchR1Error

        raise SearchR1Error(
            f"builtin:tiny: the shipped warm start is missing ({SHIPPED_WARM_START / 'config.json'}"
            " not found; searchr1 was installed without its package data): reinstall searchr1, "
            "or rebuild the weights from a checkout with python scripts/build_warm_start.py "
            f"--shipped --out {SHIPPED_WARM_START}"
        )
    for item in SHIPPED_WARM_START.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, Path(folder) / item.name)


def build_tiny_random(folder: Path) -> None:
    """Builder of ``builtin:tiny-random``: built-in text, vocabulary 1024, random weights."""
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tiny_model

    build_tiny_model(Path(folder), BUILTIN_TEXT, vocab_size=1024, seed=0)
