"""The ``agent_protocols`` plugin: registers the built-in agent protocols (``[rollout] protocol``).

* ``tags`` (:class:`searchr1.kit.protocols.tags.TagsProtocol`): Search-R1's ``<search>`` /
  ``<information>`` / ``<answer>`` tags inside one assistant message;
* ``tool_calls`` (:class:`searchr1.kit.protocols.tool_calls.ToolCallsProtocol`): the chat
  template's native tool calls, in the call format the template itself writes, with a final
  ``Answer:`` line; reasoning inside ``<think>`` blocks is never an action.

The protocols live in :mod:`searchr1.kit.protocols`, where other plugins reuse them.
"""

from __future__ import annotations

from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.kit.protocols.tool_calls import ToolCallsProtocol
from searchr1.sdk import AgentProtocol, Register, hookimpl


@hookimpl
def register_agent_protocols(register: Register[type[AgentProtocol]]) -> None:
    register(TagsProtocol.name, TagsProtocol)
    register(ToolCallsProtocol.name, ToolCallsProtocol)
