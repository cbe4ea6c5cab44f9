"""Remote model providers: ``taotoken`` and ``tinker``, one adapter over Tinker-shaped SDKs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from searchr1.plugins.remote_model.advice import advise
from searchr1.plugins.remote_model.conversions import REMOTE_CAPABILITIES
from searchr1.plugins.remote_model.settings import RemoteSettings, infer_taotoken
from searchr1.sdk import Model, ModelFactory, Register, hookimpl

if TYPE_CHECKING:
    from searchr1.sdk import Config


#: every step waits on the service and on search in turn, so overlapping the next step's
#: rollouts with this step's training pays (``bench/pipeline.py`` measures it)
PIPELINED = (
    1,
    "the next step's rollouts run while the service trains this one (docs/benchmarks.md, "
    "pipelined steps)",
)


def _factory(provider_name: str, default_sdk: str) -> Callable[[Config], Model]:
    def create(config: Config) -> Model:
        from searchr1.plugins.remote_model.provider import RemoteModelProvider

        provider = RemoteModelProvider(config, provider_name=provider_name, default_sdk=default_sdk)
        return Model(sampler=provider, trainer=provider)

    return create


@hookimpl
def register_model_providers(register: Register[ModelFactory]) -> None:
    declared = {
        "settings": RemoteSettings,
        "reads": ("api_base", "api_key"),
        "defaults": {"train.max_staleness": PIPELINED},
        "advise": advise,
        "capabilities": REMOTE_CAPABILITIES,
    }
    register(
        "taotoken",
        _factory("taotoken", "pytrio"),
        infer_provider=infer_taotoken,
        secret_variables={"api_key": "TAOTOKEN_API_KEY"},
        **declared,
    )
    register(
        "tinker",
        _factory("tinker", "tinker"),
        secret_variables={"api_key": "TINKER_API_KEY"},
        **declared,
    )
