"""What the ``taotoken`` and ``tinker`` providers both promise, each over its real SDK and real
HTTP to a loopback fake of its service (``tests/helpers/fake_pytrio_service.py``,
``tests/helpers/fake_tinker_service.py``) whose computation is the ``local`` provider on the tiny
model: sampling, a training step against ``local``, the sampler after ``optim_step`` and a
pinned one, save/resume, transient 429/5xx, a rejected key. Each test runs once per backend
(the ``backend`` fixture); what only one service does is tested in ``test_remote_model.py``
(taotoken) and ``test_remote_tinker.py`` (tinker)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from remote_helpers import (
    ADAM,
    IS_LOSS,
    check_pin_holds_until_the_next_pin,
    make_datums,
    one_step,
    remote_config,
)
from trainer_calls import forward_backward, load_state, optim_step

from searchr1.core.config import load_config
from searchr1.core.config_schema import Config
from searchr1.core.errors import RemoteAuthError
from searchr1.core.plugins import load_registry
from searchr1.core.step_metrics import ratio_metrics
from searchr1.core.types import AdamParams, Datum, SamplingParams
from searchr1.plugins.losses import NamedLoss, ppo
from searchr1.plugins.remote_model.provider import RemoteModelProvider

BACKENDS = ("taotoken", "tinker")


@dataclass(frozen=True)
class Backend:
    """One remote provider over its fake service, and what differs between the services."""

    name: str
    sdk: str  # the SDK the provider drives: "pytrio" or "tinker"
    fake: Any  # FakePyTrio or FakeTinker
    tmp_path: Path
    api_key: str
    env_var: str  # the variable a user's config names for the key
    wrong_key: str  # a key of the service's shape that it rejects
    model_table: dict[str, object]  # [model.<name>] every test uses
    key_test_table: str  # the [model.<name>] TOML of the rejected-key test ("" for none)
    sample_request: str | None  # a request each sample makes, as fake.count() names it
    samplers_made: str  # fake.count() of the samplers the service made
    step_done: str  # fake.count() of forward_backward computations
    ppo_loss: NamedLoss
    checkpoint_record_has: tuple[str, ...]
    warm_before_faults: bool  # take one step first, so the faults hit a live training run
    transient_faults: Callable[[Any], tuple[Any, ...]]  # inject 429 x2, 503 x2, 502 x1

    def config(self, **table: object) -> Config:
        return remote_config(
            self.name, self.fake.base_url, self.api_key, {**self.model_table, **table}
        )

    def open(self, config: Config | None = None) -> RemoteModelProvider:
        return RemoteModelProvider(
            config or self.config(), provider_name=self.name, default_sdk=self.sdk
        )


def _taotoken_faults(fake: Any) -> tuple[Any, ...]:
    return (
        fake.inject("POST", r"^/actor/v1/events$", 429, times=2),
        fake.inject("GET", r"^/actor/v1/events/", 503, times=2),
        fake.inject("POST", r"/sampling-runs$", 502, times=1),
    )


def _tinker_faults(fake: Any) -> tuple[Any, ...]:
    return (
        fake.inject("POST", r"^/api/v1/forward_backward$", 429, times=2),
        fake.inject("POST", r"^/api/v1/retrieve_future$", 503, times=2),
        fake.inject("POST", r"^/api/v1/save_weights_for_sampler$", 502, times=1),
    )


def _start_service(name: str) -> Any:
    if name == "taotoken":
        pytest.importorskip("pytrio")
        from fake_pytrio_service import FakePyTrio

        return FakePyTrio()
    pytest.importorskip("tinker")
    from fake_tinker_service import FakeTinker

    return FakeTinker()


@pytest.fixture(scope="module", params=BACKENDS)
def service(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """The fake service of one backend, started once for this file."""
    with _start_service(request.param) as fake:
        yield request.param, fake


def _backend(name: str, fake: Any, tmp_path: Path) -> Backend:
    if name == "taotoken":
        from fake_pytrio_service import API_KEY

        return Backend(
            name=name,
            sdk="pytrio",
            fake=fake,
            tmp_path=tmp_path,
            api_key=API_KEY,
            env_var="TAOTOKEN_API_KEY",
            wrong_key="sk-wrong-key-123456",
            model_table={
                "sdk_home": str(tmp_path / "pytrio-home"),
                "retry_timeout_seconds": 3.0,
                "retry_initial_delay_seconds": 0.05,
                "request_timeout_seconds": 30,
            },
            key_test_table=(
                f'[model.taotoken]\nsdk_home = "{tmp_path / "home"}"\nretry_timeout_seconds = 1.0\n'
            ),
            sample_request=None,
            samplers_made="sampling_runs",  # save_weights_and_get_sampling_client
            step_done="done:trainer.forward_backward",
            ppo_loss=NamedLoss("ppo", ppo),
            checkpoint_record_has=(),
            warm_before_faults=False,
            transient_faults=_taotoken_faults,
        )
    from fake_tinker_service import API_KEY

    return Backend(
        name=name,
        sdk="tinker",
        fake=fake,
        tmp_path=tmp_path,
        api_key=API_KEY,
        env_var="TINKER_API_KEY",
        wrong_key="tml-wrong-key-123456",
        model_table={},
        key_test_table="",
        sample_request="POST /api/v1/asample",
        samplers_made="sampling_sessions",  # one snapshot of the new weights
        step_done="done:ForwardBackward",
        # clip bounds travel from loss_fn.settings as Tinker thresholds
        ppo_loss=NamedLoss("ppo", ppo, {"clip_low": 0.1, "clip_high": 0.15}),
        checkpoint_record_has=('"sdk": "tinker"', "tinker://"),
        warm_before_faults=True,
        transient_faults=_tinker_faults,
    )


@pytest.fixture
def backend(service: tuple[str, Any], tmp_path: Path) -> Iterator[Backend]:
    """One backend with its service cleared of faults and accepting its key."""
    name, fake = service
    chosen = _backend(name, fake, tmp_path)
    fake.clear_faults()
    fake.api_key = chosen.api_key
    yield chosen
    fake.clear_faults()
    fake.api_key = chosen.api_key


@pytest.fixture
def provider(backend: Backend) -> Iterator[RemoteModelProvider]:
    p = backend.open()
    yield p
    p.close()


def slow_on(*names: str) -> pytest.MarkDecorator:
    """Run a test on every backend, marked ``slow`` on the ones named."""
    params = [pytest.param(n, marks=pytest.mark.slow) if n in names else n for n in BACKENDS]
    return pytest.mark.parametrize("service", params, indirect=True)


# --------------------------------------------------------------------------- sampling


def test_sampling_returns_tokens_and_logprobs_of_the_current_weights(provider, backend):
    prompt = provider.tokenizer.encode("The quick brown fox")
    seqs = asyncio.run(provider.sample(prompt, 3, SamplingParams(max_tokens=6, seed=7)))
    assert len(seqs) == 3
    if backend.sample_request:
        assert backend.fake.count(backend.sample_request) >= 1
    for seq in seqs:
        assert 1 <= len(seq.tokens) <= 6
        assert len(seq.logprobs) == len(seq.tokens)
        assert all(lp < 0.0 for lp in seq.logprobs)
        assert seq.stop_reason in ("stop", "length")
    # The sampler's log-probs are the learner's for the same weights: on-policy ratio 1.
    seq = seqs[0]
    full = prompt + list(seq.tokens)
    gen = len(prompt) - 1
    datum = Datum(
        tuple(full[:-1]),
        tuple(full[1:]),
        tuple([0.0] * gen + list(seq.logprobs)),
        tuple([0.0] * gen + [1.0] * len(seq.tokens)),
    )
    result = forward_backward(provider, [datum], IS_LOSS)
    assert result.metrics["tokens"] == len(seq.tokens)
    assert "ratio_mean" not in result.metrics  # sums only: the core derives the means
    assert ratio_metrics(result.metrics)["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


@slow_on("taotoken")
def test_sampling_after_optim_step_uses_the_new_weights(provider, backend):
    prompt = provider.tokenizer.encode("Question: who wrote the novel?")
    params = SamplingParams(max_tokens=4, seed=3)
    before = asyncio.run(provider.sample(prompt, 1, params))[0]
    samplers = backend.fake.count(backend.samplers_made)
    forward_backward(provider, make_datums(len(provider.tokenizer)), IS_LOSS)
    optim_step(provider, AdamParams(learning_rate=0.5))
    assert backend.fake.count(backend.samplers_made) == samplers + 1
    after = asyncio.run(provider.sample(prompt, 1, params))[0]
    assert after.logprobs != before.logprobs


def test_a_pinned_sampler_keeps_its_weights_until_the_next_pin(provider):
    check_pin_holds_until_the_next_pin(provider)


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("loss_name", ["importance_sampling", "ppo"])
def test_one_training_step_matches_the_local_provider(backend, loss_name):
    from searchr1.plugins.local_model.provider import LocalModelProvider

    loss_fn = IS_LOSS if loss_name == "importance_sampling" else backend.ppo_loss
    config = backend.config()
    remote = backend.open(config)
    local = LocalModelProvider.from_config(config)
    try:
        datums = make_datums(len(local.tokenizer))
        r_loss, r_norm, r_after = one_step(remote, datums, loss_fn)
        l_loss, l_norm, l_after = one_step(local, datums, loss_fn)
    finally:
        remote.close()
        local.close()
    assert r_loss == pytest.approx(l_loss, abs=1e-4)
    assert r_norm == pytest.approx(l_norm, rel=1e-4)
    assert r_after == pytest.approx(l_after, abs=1e-4)
    assert r_after != pytest.approx(r_loss, abs=1e-3)  # the step changed the weights


@pytest.mark.slow
def test_save_state_then_resume_continues_with_weights_and_optimizer(backend):
    folder = backend.tmp_path / "ckpt" / "step-000001"
    datums = make_datums(725, seed=5)
    first = backend.open()
    forward_backward(first, datums, IS_LOSS)
    optim_step(first, ADAM)
    first.save_state(str(folder))
    record = (folder / "remote_checkpoint.json").read_text("utf-8")
    assert all(part in record for part in backend.checkpoint_record_has), record
    continued = one_step(first, datums)
    first.close()

    resumed = backend.open()
    load_state(resumed, str(folder))
    again = one_step(resumed, datums)
    resumed.close()
    assert again == pytest.approx(continued, abs=1e-5)


# --------------------------------------------------------------------------- failures


def test_429_and_5xx_are_retried_and_the_step_is_applied_once(provider, backend):
    datums = make_datums(725)
    if backend.warm_before_faults:
        forward_backward(provider, datums[:1], IS_LOSS).loss  # noqa: B018 -- the model exists now
        optim_step(provider, ADAM)
    done_before = backend.fake.count(backend.step_done)
    faults = backend.transient_faults(backend.fake)
    result = forward_backward(provider, datums, IS_LOSS)
    optim_step(provider, ADAM)
    assert tuple(f.hits for f in faults) == (2, 2, 1)
    assert math.isfinite(result.loss) and result.metrics["tokens"] > 0
    assert backend.fake.count(backend.step_done) == done_before + 1


def test_rejected_key_names_the_environment_variable(backend, config_file):
    toml = config_file(
        f"""
[model]
provider = "{backend.name}"
api_base = "{backend.fake.base_url}"
api_key = "${{{backend.env_var}}}"
base_model = "builtin:tiny-random"
temperature = 1.0
max_new_tokens = 32

[lora]
rank = 8

{backend.key_test_table}"""
    )
    config = load_config(toml, env={backend.env_var: backend.wrong_key}, registry=load_registry())
    with pytest.raises(RemoteAuthError, match=f"{backend.env_var} is empty or wrong") as info:
        backend.open(config)
    assert "401" in str(info.value)
    assert backend.wrong_key not in str(info.value)
