"""Issue 18: a loss carries its name and settings, and a remote provider's declared losses
refuse one it cannot train with when the run is built (``Run.start``), before any
rollout -- not at the first ``forward_backward`` after a whole rollout. Real ``tinker`` SDK
against the loopback fake (``tests/helpers/fake_tinker_service.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("tinker")

from fake_tinker_service import API_KEY, FakeTinker  # noqa: E402
from remote_helpers import TARGETS  # noqa: E402

from searchr1.core.config_schema import Config  # noqa: E402
from searchr1.core.errors import ConfigError  # noqa: E402
from searchr1.core.hookspecs import hookimpl  # noqa: E402
from searchr1.core.plugins import load_registry  # noqa: E402
from searchr1.core.runs import Run  # noqa: E402
from searchr1.plugins.losses import NamedLoss, importance_sampling  # noqa: E402


@pytest.fixture(scope="module")
def fake():
    with FakeTinker() as service:
        yield service


def new_run(fake: FakeTinker, tmp_path: Path, loss_fn: str, loss_table: dict) -> Run:
    plugin = SimpleNamespace(
        register_loss_fns=hookimpl(
            lambda register: register(
                "my_loss", lambda c: NamedLoss("my_loss", importance_sampling)
            )
        )
    )
    registry = load_registry(extra_plugins=[plugin])
    config = Config(assets=registry.assets).replace(
        model={
            "provider": "tinker",
            "api_base": fake.base_url,
            "api_key": API_KEY,
            "base_model": "builtin:tiny-random",
            "temperature": 1.0,
        },
        lora={"rank": 8, "target_modules": TARGETS},
        train={"loss_fn": loss_fn},
    )
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "title": "Paris", "text": "The capital of France."}\n')
    tables = {"train.loss": loss_table, "search.local": {"corpus": str(corpus)}}
    config = dataclasses.replace(config, plugins={**config.plugins, **tables})
    return Run(config, registry, tmp_path)


@pytest.mark.parametrize(
    ("loss_fn", "table", "message"),
    [
        ("my_loss", {}, r"train.loss_fn = 'my_loss'.*importance_sampling, ppo, cispo"),
        ("ppo", {"ratio_cap": 2.0}, r"train.loss_fn = 'ppo' is built with ratio_cap = 2"),
    ],
)
def test_unsupported_remote_loss_fails_when_the_run_is_built(
    fake, tmp_path, loss_fn, table, message
):
    finished = len(fake.finished)
    with pytest.raises(ConfigError, match=message):
        asyncio.run(new_run(fake, tmp_path, loss_fn, table).start(need_loss=True))
    # Nothing was sampled or trained, and the provider that refused closed its session.
    assert fake.count("POST /api/v1/asample") == 0
    assert fake.count("POST /api/v1/create_model") == 0
    assert len(fake.finished) == finished + 1


def test_supported_loss_builds_and_its_settings_reach_the_provider(fake, tmp_path):
    run = new_run(fake, tmp_path, "cispo", {"clip_low": 0.1, "clip_high": 0.3})
    asyncio.run(run.start(need_loss=True))
    try:
        assert run.loss.name == "cispo"
        assert run.loss.settings == {
            "clip_low": 0.1,
            "clip_high": 0.3,
            "ratio_cap": 0.0,
            "kl_coef": 0.0,
        }
    finally:
        asyncio.run(run.aclose())


def test_a_datum_aggregation_weight_travels_in_its_advantages() -> None:
    """``[train] loss_agg_mode`` reaches a service that computes the loss itself: the
    policy losses are linear (ppo: positively homogeneous) in the advantage, so the datum's
    weight multiplies its advantages like ``loss_scale`` does (the real SDK's ``Datum``)."""
    import tinker

    from searchr1.core.types import Datum
    from searchr1.plugins.remote_model.conversions import sdk_datum

    datum = Datum((1, 2, 3), (2, 3, 4), (0.0, -1.0, -2.0), (0.0, 1.0, -2.0), weight=0.25)
    sent = sdk_datum(tinker, datum, 0.5).loss_fn_inputs["advantages"].to_numpy()
    assert sent.tolist() == [0.0, 0.125, -0.25]
