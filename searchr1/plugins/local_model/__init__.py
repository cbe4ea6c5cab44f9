"""The ``local`` model provider: sampling and LoRA training in this process (torch + peft).

Modules: ``provider`` (the sampler and trainer in one object), ``sampler`` (batched KV-cached
generation in a worker thread) with ``admission``, ``sample_request``, ``generation``,
``next_token``, ``kv_cache`` and ``reuse``; ``snapshot`` (the sampler's copy of the weights).
The learner, its loading and its trainer are :mod:`searchr1.kit.learner`'s (the ``vllm``
provider trains with them too). Importing it is cheap: torch loads when the factory runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.kit.learner.loading import LocalSettings
from searchr1.kit.learner.lora_coverage import check_model, lora_advice
from searchr1.sdk import Model, ModelFactory, Register, hookimpl

if TYPE_CHECKING:
    from searchr1.sdk import Config


def _create_local(config: Config) -> Model:
    from searchr1.plugins.local_model.provider import LocalModelProvider

    provider = LocalModelProvider.from_config(config)
    return Model(sampler=provider, trainer=provider)


def check_local(config: Config) -> list[str]:
    """The ``local`` provider's ``check``: its ``[model.local]`` settings together, then the
    model's (:func:`~searchr1.kit.learner.lora_coverage.check_model`)."""
    from searchr1.kit.learner.loading import fsdp_sampling_problem
    from searchr1.sdk import plugin_settings

    problem = fsdp_sampling_problem(plugin_settings(config, "model", "local", LocalSettings))
    where = config.where("model.local.fsdp_sampling")
    return ([f"{where}: {problem}"] if problem else []) + check_model(config)


@hookimpl
def register_model_providers(register: Register[ModelFactory]) -> None:
    register(
        "local",
        _create_local,
        settings=LocalSettings,
        reads=("device", "dtype"),
        default="the model runs in this process",
        advise=lora_advice,
        check=check_local,
    )
