"""The ``local`` model provider: sampling and LoRA training in this process (torch + peft).

Registered through the ``searchr1`` entry point (``local_model``) like any third-party plugin
and chosen by ``[model] provider = "local"``. Importing this package stays cheap: torch and
transformers are imported only when the factory runs.

Modules: ``provider`` (LocalModelProvider, the factory's model's sampler and trainer in one
object), ``sampler`` (batched
KV-cached generation in a worker thread), ``admission`` (which requests run together),
``sample_request`` (a call's way to that thread and back), ``generation`` (one
running batch: chunked prefill, decode steps), ``next_token`` (next-token choice from
logits), ``kv_cache`` (row surgery on the cache, any layer kind), ``reuse`` (caches kept
between a trajectory's turns), ``budget`` (the sampler's token budget), ``lora_coverage``
(which layer types the adapter reaches), ``learner``
(log-probs, loss, backward, AdamW), ``state`` (checkpoints), ``device`` (device, dtype,
CPU threads). ``builtin:`` paths in ``[model] base_model`` are opened through
:mod:`searchr1.core.builtins` (the ``offline_world`` plugin registers the tiny models).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import Model

if TYPE_CHECKING:
    from searchr1.core.config import Config


def _create_local(config: Config) -> Model:
    from searchr1.plugins.local_model.provider import LocalModelProvider

    provider = LocalModelProvider.from_config(config)
    return Model(sampler=provider, trainer=provider)


def lora_config_warnings(config: Config) -> list[str]:
    """The factory's pre-run check (``config check``, ``smoke`` and ``train`` call it through
    :func:`searchr1.core.config_advice.provider_warnings`): layer types of the model that
    ``[lora] target_modules`` leaves without any adapted module."""
    from searchr1.plugins.local_model.lora_coverage import coverage_warnings

    return coverage_warnings(config)


_create_local.config_warnings = lora_config_warnings  # type: ignore[attr-defined]


@hookimpl
def register_model_providers(register: Callable[[str, Callable[[Config], Any]], None]) -> None:
    register("local", _create_local)
