"""A remote step costs one service wait, not one per call: awaiting ``forward_backward``
submits it and hands back the answer's awaitable, and ``optim_step`` submits behind it before
awaiting anything.

Real ``pytrio`` SDK, real HTTP to the loopback fake (``tests/helpers/fake_pytrio_service.py``) with
200 ms injected into every wait for an event's result (``GET /actor/v1/events/{id}``). The
assertion is on the fake's own request log -- how many result waits were in flight at once --
not on a wall-clock threshold."""

from __future__ import annotations

import asyncio
import math

import pytest

pytest.importorskip("pytrio")

from fake_pytrio_service import API_KEY, FakePyTrio  # noqa: E402
from remote_helpers import ADAM, IS_LOSS, make_datums  # noqa: E402
from test_remote_model import make_config  # noqa: E402
from trainer_calls import forward_backward, train_step  # noqa: E402

from searchr1.core.errors import RemoteStepError  # noqa: E402
from searchr1.plugins.remote_model.provider import RemoteModelProvider  # noqa: E402

LATENCY = 0.2
WAIT_PATH = r"^/actor/v1/events/"


@pytest.fixture(scope="module")
def fake():
    with FakePyTrio() as service:
        yield service


@pytest.fixture
def provider(fake, tmp_path):
    fake.clear_faults()
    fake.api_key = API_KEY
    p = RemoteModelProvider(make_config(fake, tmp_path))
    yield p
    p.close()
    fake.clear_faults()


def max_in_flight(requests: list[tuple[str, str, float, float]], since: float) -> int:
    """The most result waits (GET event) that were open at the same moment after ``since``."""
    edges = []
    for method, path, start, end in requests:
        if method == "GET" and path.startswith("/actor/v1/events/") and start >= since:
            edges += [(start, 1), (end, -1)]
    open_now = peak = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        open_now += delta
        peak = max(peak, open_now)
    return peak


def step(provider, datums, n_micro: int, *, read_each: bool) -> tuple[float, float]:
    """One train-loop step of ``n_micro`` micro-batches. ``read_each`` awaits every answer
    right after its call (a loop that waits on each call)."""
    size = len(datums) // n_micro

    async def run() -> tuple[float, float]:
        results = []
        for k in range(n_micro):
            part = datums[k * size : (k + 1) * size]
            result = await provider.forward_backward(part, IS_LOSS, 1 / n_micro)
            results.append(await result if read_each else result)
        metrics = await provider.optim_step(ADAM)
        done = results if read_each else [await r for r in results]
        return sum(r.loss for r in done), metrics["grad_norm"]

    return asyncio.run(run())


def test_micro_batches_and_optim_step_are_awaited_together(provider, fake):
    n_micro = 3
    datums = make_datums(len(provider.tokenizer), n=6)
    step(provider, datums, n_micro, read_each=False)  # init the trainer outside the measurement
    fake.inject("GET", WAIT_PATH, 0, delay=LATENCY, times=10_000)

    since = fake.requests[-1][3]
    sequential = step(provider, datums, n_micro, read_each=True)
    one_by_one = max_in_flight(fake.requests, since)

    since = fake.requests[-1][3]
    pipelined = step(provider, datums, n_micro, read_each=False)
    together = max_in_flight(fake.requests, since)

    # Before: each call was awaited alone (N+1 waits in a row). Now the N forward_backward
    # events and the optimizer step are all awaited at the same time: one wait per step.
    assert one_by_one == 1
    assert together == n_micro + 1
    # Deferring changes when results are read, not what they are.
    assert all(math.isfinite(x) for x in (*sequential, *pipelined))
    assert pipelined[0] != pytest.approx(sequential[0], abs=1e-6)  # the step trained


def test_an_answer_awaited_before_optim_step_is_the_same_value(provider):
    datums = make_datums(len(provider.tokenizer), n=4)

    async def run() -> tuple[float, float, float]:
        queued = await provider.forward_backward(datums, IS_LOSS)
        early = await queued  # before optim_step
        await provider.optim_step(ADAM)
        return early.loss, (await queued).loss, early.metrics["tokens"]

    early, late, tokens = asyncio.run(run())
    assert early == late and tokens > 0


def test_failed_forward_backward_surfaces_in_optim_step_and_stops_the_run(provider, fake):
    datums = make_datums(len(provider.tokenizer), n=4)
    train_step(provider, [(datums, 1.0)], IS_LOSS, ADAM)  # init the trainer
    fake.inject("POST", r"^/actor/v1/events$", 503, times=10_000)

    async def run() -> None:
        queued = await provider.forward_backward(datums, IS_LOSS)  # submitted: no error yet
        with pytest.raises(RemoteStepError, match="forward_backward") as info:
            await provider.optim_step(ADAM)
        assert "--resume" in str(info.value)
        with pytest.raises(RemoteStepError):
            await queued  # the failure is the answer

    asyncio.run(run())
    fake.clear_faults()
    with pytest.raises(RemoteStepError, match="--resume"):
        forward_backward(provider, datums, IS_LOSS)


def test_tinker_service_session_is_finished_on_close():
    """tinker 0.38's ``ServiceClient.close`` takes the finish status and returns a future;
    calling it bare raised TypeError (logged as remote_close_failed, session left open)."""
    tinker = pytest.importorskip("tinker")
    from searchr1.plugins.remote_model.sdk import close_service

    service = tinker.ServiceClient(api_key="tml-unused", base_url="http://127.0.0.1:9")
    close_service(service)  # no session was opened: nothing to send, must not raise
    with pytest.raises(RuntimeError, match="closed"):
        service.create_sampling_client(base_model="unused")
