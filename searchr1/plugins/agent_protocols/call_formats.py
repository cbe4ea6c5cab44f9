"""The built-in tool-call formats (:class:`~searchr1.core.call_format.CallFormat`), registered
by this plugin's ``register_call_formats`` hook; a third-party plugin adds a family the same way.

``json`` (:class:`JsonCallFormat`) -- Qwen3, Qwen2.5 and Hermes-style templates::

    <tool_call>
    {"name": "search", "arguments": {"query": "who wrote the little prince"}}
    </tool_call>

  One JSON object per block; ``arguments`` is an object (some models write it as a JSON
  string holding the object, which is accepted; ``parameters`` is accepted as a synonym).
  The template serialises the arguments with ``tojson`` (``", "`` and ``": "`` separators,
  non-ASCII kept), which :meth:`JsonCallFormat.render` reproduces.

``xml`` (:class:`XmlCallFormat`) -- Qwen3.5 (and Qwen3-Coder) templates::

    <tool_call>
    <function=search>
    <parameter=query>
    who wrote the little prince
    </parameter>
    </function>
    </tool_call>

  The function name follows ``<function=``; each argument is a ``<parameter=NAME>`` element
  whose value sits on its own lines (the template writes ``"\\n" + value + "\\n"``; string
  values are written raw, not JSON-quoted). The parser strips the surrounding whitespace of a
  value and tolerates missing newlines, as the public Qwen3.5 tool parsers do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from searchr1.core.call_format import CallFormat, ParsedCall


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
