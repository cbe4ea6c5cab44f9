"""The call-format contract: how one model family writes a tool call, and how the format a chat
template uses is found. A plugin kind (hook ``register_call_formats``). A tool-call protocol
asks :func:`detect_call_format` once which format the tokenizer's template writes, so the
prompt, scripted turns and the parser agree. Formats are tried in name order; at most one can
match, since a match is the template's own rendering, verbatim.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from searchr1.core.errors import ConfigValueError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

#: The query the format probe renders; plain ASCII words so every serialiser writes it as is.
PROBE_QUERY = "searchr1 probe query"


@dataclass(frozen=True)
class ParsedCall:
    """One tool call read from a call block: the function name and its arguments."""

    name: str
    arguments: Mapping[str, Any]


class CallFormat(ABC):
    """One family's way of writing a call between :attr:`open` and :attr:`close`; stateless.
    Subclasses set :attr:`name`, :attr:`families` (who writes it) and the two body methods."""

    name: ClassVar[str]
    families: ClassVar[str]
    #: what opens and closes a call block (sampling stops at ``close``)
    open: ClassVar[str] = CALL_OPEN
    close: ClassVar[str] = CALL_CLOSE

    @abstractmethod
    def render_body(self, function: str, arguments: Mapping[str, Any]) -> str:
        """The text between :attr:`open` and :attr:`close` as the template writes it."""

    @abstractmethod
    def parse_body(self, body: str) -> ParsedCall | None:
        """Read one block's inner text; None when it is not a well-formed call."""

    def render(self, function: str, arguments: Mapping[str, Any]) -> str:
        """A whole call block, :attr:`open` to :attr:`close` inclusive."""
        return f"{self.open}{self.render_body(function, arguments)}{self.close}"

    def find(self, text: str) -> re.Match[str] | None:
        """The first complete call block in ``text``; ``group(1)`` is its inner text."""
        return re.search(f"{re.escape(self.open)}(.*?){re.escape(self.close)}", text, re.DOTALL)

    def example(self) -> str:
        """A search call in this format (for ``searchr1 smoke`` and error messages)."""
        return self.render("search", {"query": "<your query>"})


def describe_formats(formats: Sequence[CallFormat]) -> str:
    """One line per format: name, families and an example call (for error messages)."""
    return "\n".join(f"  {f.name} ({f.families}): {f.example()!r}" for f in formats)


def detect_call_format(
    render: Callable[[list[dict[str, Any]]], str], formats: Sequence[CallFormat]
) -> CallFormat:
    """The format the chat template writes calls in: ``render(messages)`` (tools listed, no
    generation prompt) renders one structured ``search`` call with :data:`PROBE_QUERY`; the
    first format whose :meth:`CallFormat.render` appears verbatim wins. Raises
    ConfigValueError showing what the template wrote when none matches."""
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": PROBE_QUERY}}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = render(messages)
    except Exception as exc:  # a template that rejects tool calls is a config problem
        raise ConfigValueError(
            'rollout.protocol = "tool_calls": the model\'s chat template failed to render an '
            f'assistant tool call ({type(exc).__name__}: {exc}); use protocol = "tags"'
        ) from exc
    for fmt in formats:
        if fmt.render("search", {"query": PROBE_QUERY}) in text:
            return fmt
    at = text.find(PROBE_QUERY)
    shown = text[max(at - 200, 0) : at + 200] if at >= 0 else "(nothing: the call was dropped)"
    raise ConfigValueError(
        'rollout.protocol = "tool_calls": the model\'s chat template writes tool calls in a '
        f"format no installed plugin knows, so every search would be an invalid action. The "
        f"template rendered a search call as:\n{shown}\nKnown formats:\n"
        f'{describe_formats(formats)}\nUse protocol = "tags", or install a plugin that '
        "registers the format (hook register_call_formats, docs/plugins.md)"
    )
