"""Agent protocols by name (hook ``register_agent_protocols``), from the run's registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.plugins import Registry
from searchr1.core.types import Tokenizer

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config


def protocol_class(name: str, registry: Registry) -> type[AgentProtocol]:
    """The protocol class registered as ``name``; else PluginError listing installed ones."""
    return registry.get("agent_protocol", name).factory


def make_protocol(config: Config, tokenizer: Tokenizer, registry: Registry) -> AgentProtocol:
    """The protocol chosen by ``[rollout] protocol``, bound to ``tokenizer``."""
    cls = protocol_class(config.rollout.protocol, registry)
    return cls(tokenizer, enable_thinking=config.rollout.enable_thinking)
