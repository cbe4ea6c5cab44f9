"""Loading a model's Hugging Face tokenizer by the name a config gives it (remote providers
tokenize on this machine, so they need the served model's tokenizer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from searchr1.kit.gguf import model_path
from searchr1.sdk import ConfigValueError

if TYPE_CHECKING:
    from searchr1.sdk import Asset, Config


def load_tokenizer(
    name: str, assets: Mapping[str, Asset], field: str = "model.base_model", hint: str = ""
) -> Any:
    """The tokenizer of ``name`` (a ``builtin:`` asset of ``assets``, a folder or a hub id,
    from the cache alone when the hub is out of reach: :func:`~searchr1.kit.hub.hub_path`);
    failure is a ConfigValueError naming ``field``, then ``hint``."""
    from transformers import AutoTokenizer  # heavy: only when a provider is built

    from searchr1.kit.hub import hub_path

    path = hub_path(model_path(name, assets), field, "a tokenizer", hint)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises OSError, ValueError, hub errors...
        raise ConfigValueError(
            f"{field} = {name!r}: cannot load a tokenizer ({type(exc).__name__}: {exc})"
            + (f"; {hint}" if hint else "")
        ) from exc


def provider_tokenizer(config: Config, provider: str, tokenizer: str) -> Any:
    """``[model.<provider>] tokenizer`` when set, else ``[model] base_model``."""
    hint = (
        f"provider {provider!r} tokenizes on this machine: set [model.{provider}] tokenizer "
        f"to a local folder or a hub id of the same model"
    )
    if tokenizer:
        return load_tokenizer(tokenizer, config.assets, f"model.{provider}.tokenizer", hint)
    return load_tokenizer(config.model.base_model, config.assets, "model.base_model", hint)


def local_tokenizer(config: Config) -> tuple[Any | None, str]:
    """The run's tokenizer (as :func:`provider_tokenizer` picks it) if it is on this machine,
    without any download; ``(None, why)`` otherwise. For checks before a run."""
    from transformers import AutoTokenizer

    name = str(config.plugin_table("model", config.model.provider).get("tokenizer") or "")
    name = name or config.model.base_model
    try:
        path = model_path(name, config.assets)
        return AutoTokenizer.from_pretrained(path, local_files_only=True), name
    except Exception as exc:  # not local (a hub id never downloaded), or not a tokenizer
        return None, f"{name!r} is not on this machine ({type(exc).__name__})"
