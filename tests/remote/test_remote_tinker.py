"""The ``tinker`` provider: the real ``tinker`` SDK (0.38, every call returns a future) over real
HTTP to a loopback fake of the Tinker service (``tests/helpers/fake_tinker_service.py``) whose
computation is the ``local`` provider on the tiny model. What it shares with ``taotoken`` is in
``test_remote_providers.py``; here: the session finished on close, one wait per step, the
bounded result and sampling waits, and ``searchr1 train`` end to end."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

pytest.importorskip("tinker")

from fake_tinker_service import API_KEY, FakeTinker  # noqa: E402
from remote_cli import ChecksumRewardPlugin, metric_events, write_cli_config  # noqa: E402
from remote_helpers import (
    ADAM,
    IS_LOSS,
    make_datums,
    max_in_flight,
    remote_config,  # noqa: E402
    round_trips,
    waits,
)
from trainer_calls import forward_backward  # noqa: E402

from searchr1.core.config_schema import Config  # noqa: E402
from searchr1.core.errors import RemoteStepError, RemoteTimeout  # noqa: E402
from searchr1.core.types import SamplingParams  # noqa: E402
from searchr1.plugins.remote_model.provider import RemoteModelProvider  # noqa: E402


@pytest.fixture(scope="module")
def fake():
    with FakeTinker() as service:
        yield service


@pytest.fixture(autouse=True)
def _no_faults(fake):
    fake.clear_faults()
    fake.api_key = API_KEY
    yield
    fake.clear_faults()
    fake.api_key = API_KEY


def make_config(fake: FakeTinker, **table: object) -> Config:
    return remote_config("tinker", fake.base_url, API_KEY, table)


def open_provider(fake: FakeTinker, **table: object) -> RemoteModelProvider:
    return RemoteModelProvider(
        make_config(fake, **table), provider_name="tinker", default_sdk="tinker"
    )


@pytest.fixture
def provider(fake):
    p = open_provider(fake)
    yield p
    p.close()


def test_session_is_finished_on_close_and_telemetry_stays_off(fake):
    sessions = set(fake.finished)
    telemetry = fake.count("telemetry")
    p = open_provider(fake)
    asyncio.run(p.sample([1, 2, 3], 1, SamplingParams(max_tokens=2)))
    p.close()
    assert list(set(fake.finished) - sessions) and "success" in fake.finished.values()
    assert fake.count("telemetry") == telemetry  # [model.tinker] telemetry = false (default)


def test_a_step_waits_once_for_its_micro_batches_optim_step_and_new_sampler(provider, fake):
    """Issue 19: every forward_backward, the optim_step and the sampler save are submitted
    back to back and awaited together. Measured on the fake's request log with 500 ms added to
    every result wait (``retrieve_future``), not on a wall-clock threshold."""
    n_micro = 3
    datums = make_datums(len(provider.tokenizer), n=6)

    def step(read_each: bool) -> list:
        since = time.monotonic()
        size = len(datums) // n_micro

        async def run() -> None:
            queued = []
            for k in range(n_micro):
                queued.append(
                    await provider.forward_backward(datums[k * size : (k + 1) * size], IS_LOSS)
                )
                if read_each:
                    await queued[-1]  # awaiting each answer at once
            await provider.optim_step(ADAM)
            for result in queued:
                await result

        asyncio.run(run())
        return waits(fake.requests, "/api/v1/retrieve_future", since)

    step(read_each=False)  # the training run exists before the measurement
    fake.inject("POST", r"^/api/v1/retrieve_future$", 0, delay=0.5, times=10**6)
    one_by_one = step(read_each=True)
    together = step(read_each=False)
    # Reading each loss at once: one round trip per micro-batch, then optim_step and the new
    # sampler together. Deferred: everything in one round trip.
    assert round_trips(one_by_one) == n_micro + 1
    assert round_trips(together) == 1
    assert max_in_flight(together) == n_micro + 2


def test_a_service_that_keeps_failing_stops_the_run_after_result_timeout_seconds(fake):
    """tinker retries a 5xx on its result poll without end; the provider's bounded wait turns
    that into a clear error (and the run stops: the step's state is unknown)."""
    # 5 s, not less: the warm-up call below must fit in it on a loaded machine too
    provider = open_provider(fake, result_timeout_seconds=5)
    try:
        datums = make_datums(725)
        forward_backward(provider, datums[:1], IS_LOSS)  # the model exists
        fake.inject("POST", r"^/api/v1/retrieve_future$", 503, times=10**6)
        started = time.monotonic()
        with pytest.raises(RemoteStepError, match="result_timeout_seconds = 5") as info:
            forward_backward(provider, datums, IS_LOSS)
        assert time.monotonic() - started < 30 and "--resume" in str(info.value)
    finally:
        fake.clear_faults()
        provider.close()


def test_a_sample_that_never_comes_fails_after_sampling_timeout_seconds(fake):
    # 3 s, not 1: the warm-up sample must fit in it on a loaded machine too
    provider = open_provider(fake, sampling_timeout_seconds=3)
    try:
        asyncio.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=2)))  # warm
        fake.inject("POST", r"^/api/v1/asample$", 0, delay=10.0)
        with pytest.raises(RemoteTimeout, match="sampling_timeout_seconds = 3"):
            asyncio.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=2)))
    finally:
        fake.clear_faults()
        provider.close()


@pytest.mark.slow
def test_train_and_resume_through_tinker_from_the_command_line(fake, tmp_path, monkeypatch):
    """``searchr1 train`` with ``provider = "tinker"``: the train loop's deferred reads, the
    pipelined step and the checkpoint record work end to end, and ``--resume`` continues."""
    from searchr1.cli.main import main
    from searchr1.core.plugins import load_registry

    registry = load_registry([ChecksumRewardPlugin()])  # every command runs with its reward

    def cli(argv: list[str]) -> int:
        return main(argv, registry=registry)

    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    config = write_cli_config(
        tmp_path / "cfg",
        f'provider = "tinker"\napi_base = "{fake.base_url}"\napi_key = "${{TINKER_API_KEY}}"',
        "[model.tinker]\nretry_timeout_seconds = 5.0",
    )
    run_dir = tmp_path / "run"
    args = ["train", "--config", str(config), "--run-dir", str(run_dir)]
    assert cli(args) == 0
    steps = metric_events(run_dir)
    assert sorted(steps) == [1, 2, 3]
    trained = [step for step in steps.values() if step["tokens/trained"] > 0]
    assert trained  # (a step whose groups all tie trains nothing)
    for step in trained:
        assert math.isfinite(step["loss"]) and step["tokens/trained"] > 0
        assert math.isfinite(
            step["mismatch/kl_sample_train"]
        )  # from the log-probs the service returns
    # tinker is a remote service: pipelined steps by default (max_staleness = 1)
    assert max(step["staleness/max"] for step in steps.values()) == 1
    record = next((run_dir / "checkpoints" / "step_000002").rglob("remote_checkpoint.json"))
    assert "tinker://" in record.read_text("utf-8")
    assert cli([*args, "--resume", "--max-steps", "4"]) == 0
    assert sorted(metric_events(run_dir)) == [1, 2, 3, 4]
