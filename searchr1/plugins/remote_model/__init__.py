"""Remote model providers: ``taotoken`` and ``tinker``, one adapter over Tinker-shaped SDKs.

``[model] provider = "taotoken"`` samples and trains a LoRA adapter on a remote service through
the ``pytrio`` SDK (base URL = ``api_base``, key = ``api_key``, in ``[model.taotoken]`` or in
``[model]``);
``provider = "tinker"`` drives the ``tinker`` SDK with the same adapter. A ``[model]`` table
that names no provider but sets ``api_base`` or ``api_key`` means ``taotoken``
(``create.infer_provider``). Both SDKs are the
optional extra ``pip install searchr1[remote]``. Importing this package is cheap: the SDK is
imported only when the factory runs (once per run, by the core).

Settings of the adapter itself live in ``[model.taotoken]`` / ``[model.tinker]``, see
:class:`searchr1.plugins.remote_model.settings.RemoteSettings`; ``sdk = "tinker"`` there drives a
service with the other SDK (that TaoToken's training channel is PyTRIO-compatible is not
verified, so both the SDK and the base URL stay configurable). The adapter, its failure
semantics and what happens to a step that fails half-way are documented in
:mod:`searchr1.plugins.remote_model.provider`.
"""

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
