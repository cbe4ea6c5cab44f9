"""Tool-call formats: how one model family writes a tool call (:class:`CallFormat`), and
:func:`detect_call_format`, which finds the one a chat template writes. The tool-calling
protocol holds its formats in :attr:`ToolCallsProtocol.call_formats
<searchr1.kit.protocols.tool_calls.ToolCallsProtocol.call_formats>`; a subclass adds a
family by extending that tuple. The built-ins:

The built-ins: ``json`` (:class:`JsonCallFormat`: Qwen3, Qwen2.5, Hermes) and ``xml``
(:class:`XmlCallFormat`: Qwen3.5, Qwen3-Coder); docs/agent_protocols.md shows both.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from searchr1.sdk import ConfigValueError

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


class JsonCallFormat(CallFormat):
    """``{"name": ..., "arguments": {...}}`` on its own line (Qwen3, Qwen2.5, Hermes)."""

    name = "json"
    families = "Qwen3, Qwen2.5, Hermes-style templates"

    def render_body(self, function: str, arguments: Mapping[str, Any]) -> str:
        call = {"name": function, "arguments": dict(arguments)}
        return "\n" + json.dumps(call, ensure_ascii=False) + "\n"

    def parse_body(self, body: str) -> ParsedCall | None:
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        args = call.get("arguments", call.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        return ParsedCall(call["name"], args) if isinstance(args, dict) else None


_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class XmlCallFormat(CallFormat):
    """``<function=NAME>`` with ``<parameter=KEY>`` elements (Qwen3.5, Qwen3-Coder)."""

    name = "xml"
    families = "Qwen3.5, Qwen3-Coder templates"

    def render_body(self, function: str, arguments: Mapping[str, Any]) -> str:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        return f"\n<function={function}>\n{params}</function>\n"

    def parse_body(self, body: str) -> ParsedCall | None:
        match = _FUNCTION_RE.fullmatch(body)
        if match is None:
            return None
        inner, args, pos = match.group(2), {}, 0
        for param in _PARAMETER_RE.finditer(inner):
            if inner[pos : param.start()].strip():
                return None  # text between parameters: not a call the template could write
            args[param.group(1).strip()] = param.group(2).strip()
            pos = param.end()
        if inner[pos:].strip():
            return None
        return ParsedCall(match.group(1).strip(), args)


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
        "adds the format (a ToolCallsProtocol subclass, docs/plugins.md)"
    )
