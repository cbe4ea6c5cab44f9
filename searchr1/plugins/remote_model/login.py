"""Everything a remote provider needs before its first call: settings, SDK, tokenizer, session.

Called once per run by :meth:`RemoteModelProvider.from_config
<searchr1.plugins.remote_model.provider.RemoteModelProvider.from_config>`.

LoRA. The service is told ``[lora] rank`` and which layer groups to adapt, read off
``target_modules`` by :func:`lora_groups` (any of ``q/k/v/o_proj`` -> attention, any of
``gate/up/down_proj`` -> MLP, ``lm_head`` -> unembedding); ``alpha`` and ``dropout`` are the
service's own (not sent). :func:`searchr1.plugins.remote_model.advice.advise` names each of
these in a warning at the start of ``config check``, ``smoke`` and ``train``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from searchr1.core.logs import get_logger
from searchr1.core.types import Tokenizer
from searchr1.kit.tokenizers import provider_tokenizer
from searchr1.plugins.remote_model.errors import translate
from searchr1.plugins.remote_model.sdk import import_sdk, open_service
from searchr1.plugins.remote_model.settings import RemoteSettings, api_key_variable, load_settings

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
log = get_logger()


@dataclass(frozen=True)
class Login:
    """An open session with the service and what the provider calls it with."""

    sdk: ModuleType
    service: Any
    tokenizer: Tokenizer
    settings: RemoteSettings
    key_name: str
    api_base: str


def lora_groups(targets: Sequence[str]) -> dict[str, bool]:
    """``target_modules`` as the SDK's ``train_attn`` / ``train_mlp`` / ``train_unembed``."""
    return {
        "train_attn": any(m in targets for m in _ATTN),
        "train_mlp": any(m in targets for m in _MLP),
        "train_unembed": "lm_head" in targets,
    }


def log_in(config: Config, provider_name: str, default_sdk: str) -> Login:
    """Check the config, import the SDK, load the tokenizer and open the service session.

    Raises ConfigError for a missing ``api_base`` / ``api_key``, MissingSDKError when the
    SDK is not installed, RemoteAuthError when the key is rejected."""
    settings = load_settings(config, provider_name, default_sdk)
    key_name = api_key_variable(config, provider_name)
    if config.model.temperature != 1.0:
        # Tinker-shaped services are not told the sampling temperature when they train, so
        # their learner log-probs are presumably untempered while the sampler's are tempered:
        # on-policy ratios start away from 1 (the local provider tempers both). The reference setup runs
        # at 0.8, so this is said, not refused; each step's ratio_mean (from the log-probs
        # forward_result reads back) logs the gap.
        from searchr1.plugins.remote_model.advice import temperature_note

        log.warning(
            "remote_temperature_not_1",
            temperature=config.model.temperature,
            detail=temperature_note(config),
        )
    sdk = import_sdk(settings.sdk)
    tokenizer = provider_tokenizer(config, provider_name, settings.tokenizer)
    api_base = settings.api_base.strip()
    try:
        service = open_service(sdk, api_base, settings.api_key, settings)
    except Exception as exc:
        raise translate(
            exc,
            operation="login",
            api_base=api_base,
            key_name=key_name,
            retry_seconds=settings.retry_timeout_seconds,
        ) from exc
    return Login(sdk, service, tokenizer, settings, key_name, api_base)
