"""The ``local`` model provider: sampling and LoRA training in this process (torch + peft).

Modules: ``provider`` (the sampler and trainer in one object), ``sampler`` (batched KV-cached
generation in a worker thread) with ``admission``, ``sample_request``, ``generation``,
``next_token``, ``kv_cache``, ``reuse`` and ``budget``; ``learner`` (log-probs, loss, backward,
AdamW) with ``chunked_logprobs``, ``shared_prefix``, ``reference`` and ``snapshot``; ``fsdp`` and
``sharded_learner`` under torchrun; ``state`` (checkpoints), ``device``, ``lora_coverage``.
Importing it is cheap: torch loads when the factory runs. Design notes: docs/internals.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.plugins.local_model.lora_coverage import check_model
from searchr1.plugins.local_model.provider import LocalSettings
from searchr1.sdk import Model, ModelFactory, Register, hookimpl

if TYPE_CHECKING:
    from searchr1.sdk import Config


def _create_local(config: Config) -> Model:
    from searchr1.plugins.local_model.provider import LocalModelProvider

    provider = LocalModelProvider.from_config(config)
    return Model(sampler=provider, trainer=provider)


def lora_advice(config: Config) -> list[str]:
    """What the in-process learner says about ``[lora]`` before a run (the factory's
    ``advise``; ``config check``, ``smoke`` and ``train`` print each line): dropout, which the
    learner turns off, and layer types of the model that ``target_modules`` leaves without
    any adapted module."""
    from searchr1.plugins.local_model.lora_coverage import coverage_warnings

    out = []
    if config.lora.dropout > 0:
        out.append(
            f"lora.dropout = {config.lora.dropout:g} has no effect on provider "
            f"{config.model.provider!r}: the learner scores the policy with dropout off, as the "
            f"sampler runs it, so on-policy importance ratios are 1 (a dropout-thinned learner "
            f"put them up to 1.10 at 0.05)"
        )
    return out + coverage_warnings(config)


def check_local(config: Config) -> list[str]:
    """The ``local`` provider's ``check``: its ``[model.local]`` settings together, then the
    model's (:func:`~searchr1.plugins.local_model.lora_coverage.check_model`)."""
    from searchr1.plugins.local_model.provider import fsdp_sampling_problem
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
