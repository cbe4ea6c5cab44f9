"""The call-format contract: how one model family writes a tool call. A plugin kind (hook
``register_call_formats``); a tool-call protocol finds the one its chat template writes
(:func:`searchr1.kit.call_format_probe.detect_call_format`)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


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
