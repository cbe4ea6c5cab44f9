"""Build the warm start of ``builtin:tiny``: a short supervised fine-tune on scripted
trajectories of a realistic *untrained* search agent. It makes the asset that ships in
``searchr1/plugins/offline_world/warm_start/`` (``builtin:tiny`` copies it at first use); no
``searchr1`` command runs it.

A base model asked to use a search engine does so only some of the time, guesses otherwise,
asks vague queries and stops early on two-hop questions; the warm start is taught to act
exactly like that, so RL has Search-R1's lesson to learn: when to search and what to ask. The
recipe, one step per module of ``scripts/warm_start/``:

1. the untrained model: random weights and a tokenizer trained on the world's texts
   (:mod:`warm_start.tiny_base`);
2. scripted episodes of the untrained agent against the real BM25 search, rendered with the
   rollout's own protocol code (:mod:`warm_start.scripted_agent`);
3. a supervised fine-tune on the assistant's tokens only (:mod:`warm_start.finetune`), so the
   model never trains on a document of the demo world and cannot memorise its facts, held-out
   or not.

Regenerate the shipped weights (about 20 minutes on 2 idle CPU cores) from a checkout::

    python scripts/build_warm_start.py --shipped --out searchr1/plugins/offline_world/warm_start

and bump ``TINY_VERSION`` in ``searchr1/plugins/offline_world/assets.py`` if they changed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from warm_start.finetune import finetune
from warm_start.scripted_agent import Episode, script_episodes
from warm_start.tiny_base import build_base

from searchr1.plugins.offline_world.generate import generate_world

#: Seed of the *reading* world: a second generated world, disjoint from the demo's facts,
#: whose episodes are also trained on their search results (see :func:`build_warm_start`).
READING_WORLD_SEED = 1000
#: Loss weight of an observation token in a reading episode (assistant tokens weigh 1).
READ_WEIGHT = 0.2


def build_warm_start(
    out_dir: Path,
    *,
    seed: int = 0,
    steps: int = 1500,
    batch_size: int = 32,
    lr: float = 2e-3,
    episodes_per_question: int = 2,
    read_weight: float = READ_WEIGHT,
    init: Path | None = None,
) -> Path:
    """The whole pipeline into ``out_dir``: world, base model, scripted episodes, fine-tune,
    ``save_pretrained`` (model and tokenizer). Deterministic for the same arguments on the
    same torch build and thread count.

    Half of the episodes come from a second, *reading* world (other names, other facts) and
    are also trained on their observations (weight ``read_weight``). A base model arrives
    able to read and copy; a randomly initialised one learns copying (the induction pattern
    "Title: X) X was ...") from the few assistant tokens alone far too slowly. Training on
    the demo world's own documents would instead let the model memorise the demo's facts,
    so only the reading world's are used. ``init`` continues from a model folder this
    function wrote (its tokenizer and weights) instead of a fresh random model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1.core.assets import resolve
    from searchr1.core.config import default_config_text, load_config
    from searchr1.core.logs import get_logger
    from searchr1.core.plugins import load_registry
    from searchr1.core.protocols import make_protocol, protocol_class
    from searchr1.plugins.local_search import LocalBM25Search
    from searchr1.plugins.offline_world.generate import WORLD_SEED, write_world

    log = get_logger()
    out_dir = Path(out_dir)
    # the embedded default config: the protocol, search and limits the demo trains with
    registry = load_registry()
    config = load_config(None, env={}, registry=registry)
    world = generate_world(WORLD_SEED)
    reading = generate_world(READING_WORLD_SEED)
    resolve(config.plugin_table("search", "local")["corpus"], config.assets)  # the run's corpus
    with tempfile.TemporaryDirectory() as tmp:
        base = init or build_base(
            Path(tmp) / "base", world, protocol_class(config.rollout.protocol, registry), seed
        )
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        write_world(Path(tmp) / "reading", reading)
        reading_toml = Path(tmp) / "reading.toml"
        reading_toml.write_text(
            default_config_text().replace(
                "builtin:world/corpus.jsonl", str(Path(tmp) / "reading" / "corpus.jsonl")
            )
        )
        reading_config = load_config(reading_toml, env={}, registry=registry)
        protocol = make_protocol(config, tokenizer, registry)

        async def collect() -> list[Episode]:
            out: list[Episode] = []
            for w, cfg, is_reading in ((world, config, False), (reading, reading_config, True)):
                search = LocalBM25Search.from_config(cfg)
                try:
                    for k in range(episodes_per_question):
                        batch = await script_episodes(
                            w,
                            w.train,
                            protocol,
                            search,
                            cfg,
                            seed=seed * 1000 + k + 100 * is_reading,
                        )
                        out += [dataclasses.replace(e, reading=is_reading) for e in batch]
                finally:
                    await search.aclose()
            return out

        episodes = asyncio.run(collect())
    lengths = sorted(len(e.tokens) for e in episodes)
    log.info(
        "warm_start.episodes",
        count=len(episodes),
        tokens_median=lengths[len(lengths) // 2],
        tokens_max=lengths[-1],
        params=sum(p.numel() for p in model.parameters()),
    )
    finetune(
        model,
        episodes,
        pad_id=int(tokenizer.pad_token_id),
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        read_weight=read_weight,
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_shipped(out_dir: Path) -> Path:
    """The recipe of the shipped ``searchr1/plugins/offline_world/warm_start`` weights: 1,200
    steps from a random model (seed 0, lr 2e-3), then 1,500 more on freshly scripted episodes
    (seed 1, lr 1e-3). About 20 minutes on 2 idle CPU cores."""
    with tempfile.TemporaryDirectory() as tmp:
        first = build_warm_start(Path(tmp) / "phase1", seed=0, steps=1200, lr=2e-3)
        return build_warm_start(Path(out_dir), seed=1, steps=1500, lr=1e-3, init=first)


def main(argv: Sequence[str] | None = None) -> int:
    """``python scripts/build_warm_start.py --out DIR``: build a warm start into DIR."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write the model to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--init", type=Path, help="continue from this warm-start folder")
    parser.add_argument(
        "--shipped", action="store_true", help="the shipped weights' two-phase recipe"
    )
    args = parser.parse_args(argv)
    from searchr1.core.logs import setup_logging

    setup_logging("warm_start")
    if args.shipped:
        build_shipped(args.out)
        print(f"warm start written to {args.out}")
        return 0
    build_warm_start(
        args.out,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        init=args.init,
    )
    print(f"warm start written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
