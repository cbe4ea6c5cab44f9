"""Think blocks: what of an assistant turn is reasoning, and so never an action.

Chat models with a thinking mode write their reasoning inside ``<think>...</think>`` before
the visible reply. The ``tool_calls`` protocol parses actions (tool calls, ``Answer:`` lines)
only from the visible part, so a model that drafts ``Answer: Paris?`` or a call while thinking
is not taken at its word. What it relies on
about the templates: docs/agent_protocols.md, "Think blocks".
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def visible_text(text: str, *, opens_in_thinking: bool = False) -> str:
    """``text`` with all reasoning removed (see the module docstring).

    ``opens_in_thinking``: the generation prompt ended inside an open think block, so the
    turn starts with reasoning even though it has no ``<think>`` of its own."""
    close = text.find(THINK_CLOSE)
    open_ = text.find(THINK_OPEN)
    if close >= 0 and (open_ < 0 or close < open_):
        text = text[close + len(THINK_CLOSE) :]  # the prompt opened the block
    elif opens_in_thinking:
        return ""  # still thinking when the turn ended
    out: list[str] = []
    while True:
        open_ = text.find(THINK_OPEN)
        if open_ < 0:
            out.append(text)
            break
        out.append(text[:open_])
        close = text.find(THINK_CLOSE, open_)
        if close < 0:
            break  # an unclosed block runs to the end of the turn
        text = text[close + len(THINK_CLOSE) :]
    return "".join(out)


def prompt_opens_thinking(generation_prompt: str) -> bool | None:
    """What a generation prompt (the text the template adds for ``add_generation_prompt``)
    says about thinking: True when it ends inside an open ``<think>`` block (the turn starts
    with reasoning), False when it holds a closed block (thinking switched off: the model
    answers directly), None when it says nothing (the model may open a block itself)."""
    open_, close = generation_prompt.rfind(THINK_OPEN), generation_prompt.rfind(THINK_CLOSE)
    if open_ < 0 and close < 0:
        return None
    return open_ > close
