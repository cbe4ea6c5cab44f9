"""Remote model providers: ``taotoken`` and ``tinker``, one adapter over Tinker-shaped SDKs.

``[model] provider = "taotoken"`` samples and trains a LoRA adapter on a remote service through
the ``pytrio`` SDK (base URL = ``[model] api_base``, key = ``[model] api_key``);
``provider = "tinker"`` drives the ``tinker`` SDK with the same adapter. Both SDKs are the
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
from typing import TYPE_CHECKING, Any

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import Model

if TYPE_CHECKING:
    from searchr1.core.config import Config


def _factory(provider_name: str, default_sdk: str) -> Callable[[Config], Model]:
    def create(config: Config) -> Model:
        from searchr1.plugins.remote_model.provider import RemoteModelProvider

        provider = RemoteModelProvider.from_config(
            config, provider_name=provider_name, default_sdk=default_sdk
        )
        return Model(sampler=provider, trainer=provider)

    return create


@hookimpl
def register_model_providers(register: Callable[[str, Callable[[Config], Any]], None]) -> None:
    register("taotoken", _factory("taotoken", "pytrio"))
    register("tinker", _factory("tinker", "tinker"))
