"""Agent protocols and call formats by name (hooks ``register_agent_protocols`` and
``register_call_formats``; the run's registry or the installed one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.call_format import CallFormat
from searchr1.core.plugins import Registry, installed_registry
from searchr1.core.types import Tokenizer

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config


def protocol_class(name: str, registry: Registry | None = None) -> type[AgentProtocol]:
    """The protocol class registered as ``name``; else PluginError listing installed ones."""
    return (registry or installed_registry()).get("agent_protocol", name).factory


def call_formats(registry: Registry | None = None) -> list[CallFormat]:
    """One instance of every registered call format, in name order."""
    reg = registry or installed_registry()
    return [reg.get("call_format", name).factory() for name in reg.names("call_format")]


def make_protocol(
    config: Config, tokenizer: Tokenizer, registry: Registry | None = None
) -> AgentProtocol:
    """The protocol chosen by ``[rollout] protocol``, bound to ``tokenizer``."""
    cls = protocol_class(config.rollout.protocol, registry)
    return cls(
        tokenizer,
        enable_thinking=config.rollout.enable_thinking,
        call_formats=call_formats(registry),
    )


def extract_answers(protocol: str, text: str) -> list[str]:
    """Every final-answer occurrence in one turn's ``text`` under the protocol named
    ``protocol`` (a trajectory's ``protocol`` field)."""
    return protocol_class(protocol).extract_answers(text)
