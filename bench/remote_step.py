"""Seconds and service round trips per remote training step, each call awaited alone vs. the
step awaited once, for both SDKs.

    python bench/remote_step.py                        # both SDKs, 4 micro-batches, 200 ms
    python bench/remote_step.py --sdk tinker --micro-batches 8 --latency 0.3 --steps 5

The remote provider drives the real SDK over loopback HTTP to a fake service computed by the
``local`` provider on the built-in tiny model: ``pytrio`` (``provider = "taotoken"``) against
``tests/helpers/fake_pytrio_service.py``, ``tinker`` against ``tests/helpers/fake_tinker_service.py``.
``--latency`` seconds are injected into every wait for a result (PyTRIO: ``GET
/actor/v1/events/{id}``; tinker: ``POST /api/v1/retrieve_future``), a network round trip to a
remote trainer. One step is ``--micro-batches`` ``forward_backward`` calls and one
``optim_step`` (which also fetches the sampler of the new weights), as the train loop makes
them.

``before``: each call's result is read right after it and the sampler is fetched after the
optimizer step (a train loop that reads each result before the next call), so every call waits
its own round trip. ``after``: results are read after ``optim_step`` (the train loop now), so
the provider submits all of them back to back and waits once; with tinker the sampler save is
queued behind them too. ``round_trips``: how many result waits the step made one after
another (waits that overlap count once), read from the fake's request log.

Prints one JSON line per SDK: before/after s per step, ratio, round trips before/after/saved.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))  # the loopback fakes live with the tests

from remote_helpers import round_trips, waits  # noqa: E402

import searchr1.plugins.remote_model.provider as provider_module  # noqa: E402
from searchr1.core.config_schema import Config  # noqa: E402
from searchr1.core.plugins import load_registry  # noqa: E402
from searchr1.core.types import AdamParams, Datum  # noqa: E402
from searchr1.plugins.losses import NamedLoss, importance_sampling  # noqa: E402
from searchr1.plugins.remote_model.provider import RemoteModelProvider  # noqa: E402

LOSS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=1e-3)
#: per SDK: provider name, where the SDK waits for a result (method, path)
SDKS = {
    "pytrio": ("taotoken", "GET", "/actor/v1/events/"),
    "tinker": ("tinker", "POST", "/api/v1/retrieve_future"),
}


def datums(n: int, vocab: int) -> list[Datum]:
    out = []
    for i in range(n):
        tokens = [(7 * i + 13 * j) % vocab for j in range(25)]
        out.append(
            Datum(
                tuple(tokens[:-1]),
                tuple(tokens[1:]),
                tuple(-5.0 for _ in range(24)),
                tuple(0.0 if j < 12 else (1.0 if i % 2 else -1.0) for j in range(24)),
            )
        )
    return out


def one_step(provider: RemoteModelProvider, batches: list[list[Datum]], before: bool) -> float:
    queued = provider_module.queues_sampler_save
    if before:  # the sampler is fetched only after the optimizer step was awaited
        provider_module.queues_sampler_save = lambda sdk: False  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()

        async def step() -> None:
            results = []
            for batch in batches:
                result = await provider.forward_backward(batch, LOSS, 1.0 / len(batches))
                results.append(await result if before else result)  # before: each at once
            await provider.optim_step(ADAM)
            for result in results:
                await result

        asyncio.run(step())
        return time.perf_counter() - t0
    finally:
        provider_module.queues_sampler_save = queued  # type: ignore[assignment]


def open_fake(sdk: str, stack: ExitStack) -> tuple[Any, str]:
    if sdk == "pytrio":
        from fake_pytrio_service import API_KEY, FakePyTrio

        return stack.enter_context(FakePyTrio()), API_KEY
    from fake_tinker_service import API_KEY, FakeTinker

    return stack.enter_context(FakeTinker()), API_KEY


def bench(sdk: str, args: argparse.Namespace) -> dict[str, Any]:
    provider_name, method, wait_path = SDKS[sdk]
    with ExitStack() as stack:
        fake, api_key = open_fake(sdk, stack)
        home = stack.enter_context(tempfile.TemporaryDirectory())
        config = Config(assets=load_registry().assets).replace(
            model={
                "provider": provider_name,
                "api_base": fake.base_url,
                "api_key": api_key,
                "base_model": "builtin:tiny-random",
                "temperature": 1.0,
            },
            lora={"rank": 8},
        )
        table: dict[str, Any] = {"telemetry": False}
        if sdk == "pytrio":
            table["sdk_home"] = home
        config = dataclasses.replace(config, plugins={f"model.{provider_name}": table})
        provider = RemoteModelProvider.from_config(
            config, provider_name=provider_name, default_sdk=sdk
        )
        stack.callback(provider.close)
        data = datums(2 * args.micro_batches, len(provider.tokenizer))
        batches = [data[2 * k : 2 * k + 2] for k in range(args.micro_batches)]
        one_step(provider, batches, before=True)  # warm-up: trainer + sampler exist
        fake.inject(method, "^" + wait_path, 0, delay=args.latency, times=10**9)
        times: dict[str, list[float]] = {"before": [], "after": []}
        trips: dict[str, list[int]] = {"before": [], "after": []}
        for _ in range(args.steps):  # interleaved, so drift hits both alike
            for mode in ("before", "after"):
                since = time.monotonic()
                times[mode].append(one_step(provider, batches, before=mode == "before"))
                trips[mode].append(round_trips(waits(fake.requests, wait_path, since)))
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    rt_before, rt_after = (
        statistics.median_low(trips["before"]),
        statistics.median_low(trips["after"]),
    )
    return {
        "sdk": sdk,
        "micro_batches": args.micro_batches,
        "latency_s": args.latency,
        "steps": args.steps,
        "before_s_per_step": round(before, 3),
        "after_s_per_step": round(after, 3),
        "saved_s_per_step": round(before - after, 3),
        "ratio": round(before / after, 2),
        "round_trips_before": rt_before,
        "round_trips_after": rt_after,
        "round_trips_saved": rt_before - rt_after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdk", choices=("both", *SDKS), default="both")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    for sdk in SDKS if args.sdk == "both" else (args.sdk,):
        print(json.dumps(bench(sdk, args)), flush=True)


if __name__ == "__main__":
    main()
