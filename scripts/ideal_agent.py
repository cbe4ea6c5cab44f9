"""Evaluate a built-in world's ideal agent (its ceiling,
:mod:`searchr1.plugins.offline_world.ideal_agent`) on the configured held-out set and print
the eval table: ``python scripts/ideal_agent.py [--config F] [--limit N]`` (the config's
``data.eval`` names the world: ``builtin:world/...`` or ``builtin:world-hard/...``)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    import dataclasses

    from searchr1.core.config import load_config
    from searchr1.core.data import load_questions
    from searchr1.core.evaluation import ceiling_agent, evaluate_run, format_table
    from searchr1.core.plugins import load_registry
    from searchr1.core.runs import Run

    parser = argparse.ArgumentParser(prog="python scripts/ideal_agent.py")
    parser.add_argument("--config", help="default: the embedded offline demo config")
    parser.add_argument("--limit", type=int, default=0, help="first N questions only")
    args = parser.parse_args(argv)
    registry = load_registry()
    config = load_config(args.config, registry=registry)

    async def evaluate() -> object:
        run = await Run(config, registry).start()
        try:
            env = run.env
            agent = ceiling_agent(env, registry.assets)
            await run.aclose()  # the agent plays through the model's tokenizer and protocol only
            if agent is None:
                parser.error(
                    f"data.eval = {config.data.eval!r} and rollout.protocol = "
                    f"{config.rollout.protocol!r}: an ideal agent plays builtin:world/... or "
                    f"builtin:world-hard/... with 'tags'"
                )
            questions = list(
                load_questions(config.data.eval, config.assets, field_name="data.eval").questions
            )
            if args.limit:
                questions = questions[: args.limit]
            playing = dataclasses.replace(env, sampler=agent)
            return await evaluate_run(playing, questions, label="ideal-agent")
        finally:
            await run.search.aclose()

    print(format_table(asyncio.run(evaluate())))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
