"""``[model.taotoken]`` / ``[model.tinker]``: the remote adapter's own settings.

Read once by :meth:`RemoteModelProvider.from_config`. Every field has a default, so a config
needs only ``[model] provider``, ``api_base``, ``api_key`` and ``base_model``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.config import Config, ConfigError, check_table

SDKS = ("pytrio", "tinker")


@dataclass(frozen=True)
class RemoteSettings:
    """Settings of one remote provider (all optional).

    ``retry_timeout_seconds`` bounds how long the SDK keeps retrying 408/429/5xx responses and
    connection errors/timeouts of one request before the adapter reports a clear error.
    """

    sdk: str = field(default="", metadata={"choices": ("",) + SDKS})
    #: local tokenizer (path or hub name); empty = ``[model] base_model``
    tokenizer: str = ""
    request_timeout_seconds: int = field(default=60, metadata={"min": 1})
    retry_timeout_seconds: float = field(default=300.0, metadata={"min": 0.0})
    retry_initial_delay_seconds: float = field(default=1.0, metadata={"min": 0.0})
    sampling_timeout_seconds: int = field(default=900, metadata={"min": 1})
    #: lifetime of checkpoints written by save_state; 0 = the service's default
    checkpoint_ttl_seconds: int = field(default=0, metadata={"min": 0})
    #: PyTRIO sends SDK telemetry to the service unless this is false
    telemetry: bool = False
    #: the PyTRIO SDK's home folder (its local config and telemetry spool); empty = ~/.pytrio
    sdk_home: str = ""


def load_settings(config: Config, provider_name: str, default_sdk: str) -> RemoteSettings:
    """Check ``[model.<provider_name>]`` and return its settings (ConfigError on problems)."""
    problems: list[str] = []
    values: dict[str, Any] = check_table(
        config.plugin_table("model", provider_name),
        RemoteSettings,
        f"model.{provider_name}",
        problems,
    )
    if problems:
        raise ConfigError([f"{config.source}: {p}" for p in problems])
    settings = RemoteSettings(**values)
    if not settings.sdk:
        settings = RemoteSettings(**{**values, "sdk": default_sdk})
    return settings


def api_key_variable(config: Config) -> str:
    """What to call the API key in an error: the environment variable named by the config's
    ``api_key = "${VAR}"`` placeholder when the config file says so, else ``model.api_key``."""
    source = Path(config.source)
    if source.is_file():
        try:
            import tomli

            raw = tomli.loads(source.read_text("utf-8")).get("model", {}).get("api_key", "")
        except (OSError, ValueError):
            raw = ""
        match = re.fullmatch(r"\s*\$\{([A-Za-z_][A-Za-z0-9_]*)\}\s*", str(raw))
        if match:
            return match.group(1)
    return "model.api_key"
