"""The ``vllm`` model provider: LoRA training in this process, sampling on vLLM servers.

Registered through the ``searchr1`` entry point (``vllm_model``) like any third-party plugin
and chosen by ``[model] provider = "vllm"``. Training is the ``local`` provider's (same learner,
LoRA, optimizer, checkpoints, resume); only sampling moves to vLLM's OpenAI-compatible
servers, one or several, which either already run (``[model] api_base`` or
``api_bases``, e.g. the compose ``vllm`` service) or are launched by the provider from
``[model.vllm] python`` (``servers`` of them; a separate environment: vLLM pins its own torch
and transformers; ``scripts/make-vllm-venv.sh`` builds one on a CPU host).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.kit.learner.loading import LocalSettings
from searchr1.kit.learner.lora_coverage import check_model, lora_advice
from searchr1.plugins.vllm_model.settings import VllmSettings
from searchr1.sdk import Model, ModelFactory, Register, hookimpl

if TYPE_CHECKING:
    from searchr1.sdk import Config


def _create_vllm(config: Config) -> Model:
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    # One object: its sample() goes to the server, its training is the local learner's.
    provider = VllmModelProvider.from_config(config)
    return Model(
        sampler=provider,
        trainer=provider,
        connect=provider.connect,
        disconnect=provider.disconnect,
    )


@hookimpl
def register_model_providers(register: Register[ModelFactory]) -> None:
    register(
        "vllm",
        _create_vllm,
        # the learner is the local provider's, so [model.local] (device, dtype) is read as well
        settings={"vllm": VllmSettings, "local": LocalSettings},
        reads=("api_base", "api_key", "device", "dtype"),
        advise=vllm_advice,
        check=check_model,  # its learner loads the model as the local provider does
    )


def vllm_advice(config: Config) -> list[str]:
    """The local learner's ``[lora]`` advice (the same adapter), and what vLLM's log-probs
    mean under top-p sampling."""
    out = lora_advice(config)
    if config.model.top_p < 1.0:
        out.insert(
            0,
            f"model.top_p = {config.model.top_p:g} on provider 'vllm': vLLM reports log-probs of "
            f"the top-p renormalised distribution, the learner's are before truncation, so "
            f"ratios sit below 1 by the kept mass (see mismatch/*); top_p = 1.0 matches exactly",
        )
    return out
