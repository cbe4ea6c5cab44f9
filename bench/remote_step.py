"""Seconds per remote training step, each call awaited alone vs. the step awaited once.

    python bench/remote_step.py                      # 4 micro-batches, 200 ms, 3 steps each
    python bench/remote_step.py --micro-batches 8 --latency 0.3 --steps 5

The ``taotoken`` provider drives the real ``pytrio`` SDK over loopback HTTP to the fake service
of ``tests/fake_pytrio_service.py`` (computation: the ``local`` provider on the built-in tiny
model), with ``--latency`` seconds injected into every wait for an event's result
(``GET /actor/v1/events/{id}``, a network round trip to a remote trainer). One step is
``--micro-batches`` ``forward_backward`` calls and one ``optim_step``, as ``searchr1/core/train.py``
makes them. ``before``: each call's result is read right after it (what the train loop did
before issue 19), so every call waits its own round trip. ``after``: results are read after
``optim_step`` (the train loop now), so the provider submits all of them back to back and
waits once. The sampler refresh after ``optim_step`` is one more round trip in both.

Ends by printing one JSON line: before_s_per_step, after_s_per_step, ratio, saved_s_per_step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the loopback fake lives with the tests

from fake_pytrio_service import API_KEY, FakePyTrio  # noqa: E402

from searchr1.core.config import Config  # noqa: E402
from searchr1.core.types import AdamParams, Datum  # noqa: E402
from searchr1.plugins.losses import NamedLoss, importance_sampling  # noqa: E402
from searchr1.plugins.remote_model.provider import RemoteModelProvider  # noqa: E402

LOSS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=1e-3)


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


def one_step(provider: RemoteModelProvider, batches: list[list[Datum]], read_each: bool) -> float:
    t0 = time.perf_counter()
    results = []
    for batch in batches:
        result = provider.forward_backward(batch, LOSS, 1.0 / len(batches))
        if read_each:
            result.loss  # noqa: B018 -- reading awaits the call
        results.append(result)
    provider.optim_step(ADAM)
    sum(r.loss for r in results)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    with FakePyTrio() as fake, tempfile.TemporaryDirectory() as home:
        config = Config().replace(
            model={
                "provider": "taotoken",
                "api_base": fake.base_url,
                "api_key": API_KEY,
                "base_model": "builtin:tiny-random",
                "temperature": 1.0,
            },
            lora={"rank": 8},
        )
        config = dataclasses.replace(
            config, plugins={"model.taotoken": {"sdk_home": home, "telemetry": False}}
        )
        provider = RemoteModelProvider.from_config(config)
        try:
            data = datums(2 * args.micro_batches, len(provider.tokenizer))
            batches = [data[2 * k : 2 * k + 2] for k in range(args.micro_batches)]
            one_step(provider, batches, read_each=True)  # warm-up: trainer + sampler exist
            fake.inject("GET", r"^/actor/v1/events/", 0, delay=args.latency, times=10**9)
            times = {"before": [], "after": []}
            for _ in range(args.steps):  # interleaved, so drift hits both alike
                times["before"].append(one_step(provider, batches, read_each=True))
                times["after"].append(one_step(provider, batches, read_each=False))
        finally:
            provider.close()
    before = statistics.median(times["before"])
    after = statistics.median(times["after"])
    print(
        json.dumps(
            {
                "micro_batches": args.micro_batches,
                "latency_s": args.latency,
                "steps": args.steps,
                "before_s_per_step": round(before, 3),
                "after_s_per_step": round(after, 3),
                "saved_s_per_step": round(before - after, 3),
                "ratio": round(before / after, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
