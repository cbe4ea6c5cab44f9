"""Agent protocols: how the policy asks for a search and gives its final answer.

``make_protocol(config, tokenizer)`` returns the protocol named by ``[rollout] protocol``:

* ``tags`` (:class:`TagsProtocol`): Search-R1's ``<search>`` / ``<information>`` /
  ``<answer>`` tags inside one assistant message;
* ``tool_calls`` (:class:`ToolCallsProtocol`): the chat template's native tool calls, in the
  call format the template itself writes (:mod:`.call_formats`), with a final ``Answer:``
  line; reasoning inside ``<think>`` blocks is never an action (:mod:`.thinking`).

Both produce the same :class:`~searchr1.core.types.Trajectory` record through
:mod:`searchr1.core.rollout`. Called once per run by train, smoke and eval (and by the offline
world to render scripted cold-start trajectories). Each protocol owns its answer format:
reward plugins call :func:`extract_answers` with a trajectory's ``protocol`` name, and the
class of that name reads the text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.core.agent_protocols.base import (
    Action,
    AgentProtocol,
    format_search_results,
)
from searchr1.core.agent_protocols.call_formats import CALL_FORMATS, CallFormat
from searchr1.core.agent_protocols.tags import TagsProtocol
from searchr1.core.agent_protocols.tool_calls import SEARCH_TOOL, ToolCallsProtocol

if TYPE_CHECKING:
    from searchr1.core.config import Config
    from searchr1.core.types import Tokenizer

PROTOCOLS: dict[str, type[AgentProtocol]] = {
    TagsProtocol.name: TagsProtocol,
    ToolCallsProtocol.name: ToolCallsProtocol,
}


def protocol_class(name: str) -> type[AgentProtocol]:
    """The protocol class called ``name``; ValueError naming the config field otherwise."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(repr(n) for n in PROTOCOLS)
        raise ValueError(f"rollout.protocol = {name!r} is not one of {known}") from None


def extract_answers(protocol: str, text: str) -> list[str]:
    """Every final-answer occurrence in one turn's ``text`` under the protocol named
    ``protocol`` (a trajectory's ``protocol`` field; ``""``, as in records older than that
    field, means ``tags``), read by that protocol class's own
    :meth:`~AgentProtocol.extract_answers`. Called by reward plugins once per turn."""
    try:
        cls = PROTOCOLS[protocol or "tags"]
    except KeyError:
        known = ", ".join(repr(n) for n in PROTOCOLS)
        raise ValueError(f"unknown agent protocol {protocol!r} (expected one of {known})") from None
    return cls.extract_answers(text)


def make_protocol(config: Config, tokenizer: Tokenizer) -> AgentProtocol:
    """The protocol chosen by ``config.rollout.protocol``, bound to ``tokenizer``."""
    cls = protocol_class(config.rollout.protocol)
    return cls(tokenizer, enable_thinking=config.rollout.enable_thinking)


__all__ = [
    "CALL_FORMATS",
    "PROTOCOLS",
    "SEARCH_TOOL",
    "Action",
    "AgentProtocol",
    "CallFormat",
    "TagsProtocol",
    "ToolCallsProtocol",
    "extract_answers",
    "format_search_results",
    "make_protocol",
    "protocol_class",
]
