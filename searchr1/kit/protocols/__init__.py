"""The built-in agent protocols and what they parse, for any plugin to register or extend.

:mod:`.tags` (Search-R1's tags), :mod:`.tool_calls` (the chat template's native tool calls),
:mod:`.call_formats` (how a model family writes a call, and finding the one a template writes)
and :mod:`.thinking` (what of a turn is reasoning). The ``agent_protocols`` plugin registers
the two protocols; :mod:`searchr1.kit.chatml` reads rendered chats back with these formats.
"""
