"""``[model.taotoken]`` / ``[model.tinker]``: the remote adapter's own settings.

Read once when :class:`~searchr1.plugins.remote_model.provider.RemoteModelProvider` logs
in. Every field has a default. The service's address and key are ``[model] api_base`` and
``api_key`` (where the reference setup writes them), which
is also how the ``taotoken`` plugin recognises a file that names no provider
(:func:`infer_taotoken`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from searchr1.sdk import Config, plugin_settings

SDKS = ("pytrio", "tinker")


@dataclass(frozen=True)
class RemoteSettings:
    """Settings of one remote provider (all optional).

    ``retry_timeout_seconds`` bounds how long the SDK keeps retrying 408/429/5xx responses and
    connection errors/timeouts of one request before the adapter reports a clear error.
    ``request_timeout_seconds``, ``retry_*`` and ``sdk_home`` configure PyTRIO; tinker has
    fixed ones of its own (60 s per request, retries for up to 300 s), which is why every
    wait for an answer is also bounded here (``result_timeout_seconds``,
    ``sampling_timeout_seconds``), for both SDKs.
    """

    #: the SDK that drives the service: pytrio or tinker; empty = the provider's own (taotoken:
    #: pytrio)
    sdk: str = field(default="", metadata={"choices": ("",) + SDKS})
    #: local tokenizer (path or hub name); empty = ``[model] base_model``
    tokenizer: str = ""
    #: PyTRIO: one HTTP request's timeout
    request_timeout_seconds: int = field(default=60, metadata={"min": 1})
    #: how long the SDK keeps retrying 408/429/5xx and connection errors of one request
    retry_timeout_seconds: float = field(default=300.0, metadata={"min": 0.0})
    #: PyTRIO: first wait between retries
    retry_initial_delay_seconds: float = field(default=1.0, metadata={"min": 0.0})
    #: longest wait for one sampling call's answer
    sampling_timeout_seconds: int = field(default=900, metadata={"min": 1})
    #: longest wait for the answer of one submitted call (service queueing included); 0 = no
    #: limit. tinker retries a failing result poll without end, so this is what stops it.
    result_timeout_seconds: int = field(default=900, metadata={"min": 0})
    #: lifetime of checkpoints written by save_state; 0 = the service's default
    checkpoint_ttl_seconds: int = field(default=0, metadata={"min": 0})
    #: send the SDK's telemetry to the service (both SDKs send it unless told not to; tinker
    #: is told through TINKER_TELEMETRY=0 while its session opens, unless that is set already)
    telemetry: bool = False
    #: the PyTRIO SDK's home folder (its local config and telemetry spool); empty = ~/.pytrio
    sdk_home: str = ""


def load_settings(config: Config, provider_name: str, default_sdk: str) -> RemoteSettings:
    """Check ``[model.<provider_name>]`` and what a remote provider needs from ``[model]`` and
    ``[lora]``; return the settings, an empty ``sdk`` replaced by the provider's
    ``default_sdk``. One ConfigError lists every problem."""

    def provider_needs(settings: RemoteSettings) -> list[str]:
        problems = []
        if not config.model.api_base.strip():
            problems.append(
                f"model.api_base is empty; provider {provider_name!r} needs the service URL "
                f"(TaoToken: https://taotoken.net/api)"
            )
        if not config.model.api_key.strip():
            problems.append(
                f"model.api_key is empty; provider {provider_name!r} needs a key, e.g. "
                f'api_key = "${{TAOTOKEN_API_KEY}}" with the key in the environment or .env'
            )
        if not 4 <= config.lora.rank <= 64 and (settings.sdk or default_sdk) == "pytrio":
            problems.append(
                f"lora.rank = {config.lora.rank}: the PyTRIO service trains LoRA ranks 4..64"
            )
        return problems

    settings = plugin_settings(config, "model", provider_name, RemoteSettings, provider_needs)
    return settings if settings.sdk else replace(settings, sdk=default_sdk)


def api_key_variable(config: Config, provider_name: str) -> str:
    """What to call the API key in an error: the environment variable that filled the key
    (``api_key = "${VAR}"``) when there is one, else ``model.api_key``."""
    own = config.variables.get(f"model.{provider_name}.api_key")
    return own or config.variables.get("model.api_key", "model.api_key")


def infer_taotoken(model_table: Mapping[str, Any]) -> str | None:
    """Why a ``[model]`` table that names no provider means TaoToken: it sets the service's
    ``api_base`` or ``api_key`` (the reference setup); None otherwise."""
    remote = [k for k in ("api_base", "api_key") if str(model_table.get(k, "")).strip()]
    if not remote:
        return None
    return (
        f"[model] sets {' and '.join(remote)} and no provider: sampling and training go "
        f"through the TaoToken service (the reference setup)"
    )
