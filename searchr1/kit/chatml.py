"""Rendered chat text <-> OpenAI chat messages, for the ``openai_chat`` provider."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searchr1.kit.protocols.call_formats import CallFormat, JsonCallFormat
from searchr1.sdk import SamplingParams, StopReason

_SEGMENT_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(<\|im_end\|>\n?|\Z)", re.DOTALL)
_TOOLS_RE = re.compile(r"\A(.*?)(?:\n\n)?# Tools\n.*?<tools>\n(.*?)\n</tools>", re.DOTALL)
_CALL_RE = re.compile(r"\n?<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_RESPONSE_RE = re.compile(r"\n?<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@dataclass
class Conversation:
    """A prompt read back into chat form; ``partial`` is the text of an assistant message
    that is still open (``""`` for a plain generation prompt, None when there is none)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    partial: str | None


def _take_calls(content: str, fmt: CallFormat, first_id: int) -> tuple[list[dict[str, Any]], str]:
    """The well-formed ``<tool_call>`` blocks of an assistant message as OpenAI ``tool_calls``
    (ids ``call_<n>`` from ``first_id``), and the message's text without them."""
    calls: list[dict[str, Any]] = []

    def take(block: re.Match[str]) -> str:
        parsed = fmt.parse_body(block.group(1))
        if parsed is None:
            return block.group(0)
        arguments = json.dumps(dict(parsed.arguments), ensure_ascii=False)
        calls.append(
            {
                "id": f"call_{first_id + len(calls)}",
                "type": "function",
                "function": {"name": parsed.name, "arguments": arguments},
            }
        )
        return ""

    return calls, _CALL_RE.sub(take, content).strip()


def parse_chatml(text: str, call_format: CallFormat | None = None) -> Conversation:
    """Split rendered ChatML back into messages, tools and an open assistant message.
    Assistant ``<tool_call>`` blocks are read in ``call_format`` (default: JSON); a block
    that does not parse stays in the message's text."""
    fmt = call_format or JsonCallFormat()
    if "<|im_start|>" not in text:
        return Conversation([{"role": "user", "content": text}], [], None)
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    pending_calls: list[str] = []
    partial: str | None = None
    for m in _SEGMENT_RE.finditer(text):
        role, content, closed = m.group(1), m.group(2), bool(m.group(3))
        if role == "assistant" and not closed:
            partial = content
            break
        if role == "system":
            found = _TOOLS_RE.match(content)
            if found:
                tools = [json.loads(line) for line in found.group(2).splitlines() if line.strip()]
                content = found.group(1)
            if content.strip():
                messages.append({"role": "system", "content": content})
        elif role == "assistant":
            calls, rest = _take_calls(content, fmt, first_id=len(pending_calls))
            message: dict[str, Any] = {"role": "assistant", "content": rest or None}
            if calls:
                message["tool_calls"] = calls
                pending_calls = [c["id"] for c in calls]
            messages.append(message)
        elif (
            role == "user"
            and _RESPONSE_RE.sub("", content).strip() == ""
            and "<tool_response>" in content
        ):
            for i, body in enumerate(_RESPONSE_RE.findall(content)):
                call_id = pending_calls[i] if i < len(pending_calls) else f"call_{i}"
                messages.append({"role": "tool", "tool_call_id": call_id, "content": body})
        else:
            messages.append({"role": role, "content": content})
    return Conversation(messages, tools, partial)


def thinking_prefill(partial: str | None) -> bool | None:
    """Whether an open assistant message is only a template's think prefill: True for an
    open block (``<think>\\n``: thinking on), False for a closed empty one (thinking off),
    None when it holds anything else (or there is none)."""
    text = (partial or "").strip()
    if text == "<think>":
        return True
    return False if re.fullmatch(r"<think>\s*</think>", text) else None


def _reasoning_head(message: Mapping[str, Any], content: str, thinking: bool | None) -> str:
    """The reasoning a server returned apart from the content (``reasoning_content``), written
    back as the local sampler would have produced it after the prompt's think prefill."""
    reasoning = str(message.get("reasoning_content") or message.get("reasoning") or "").strip()
    if thinking is True and "</think>" not in content:
        return f"{reasoning}\n</think>\n\n"  # the prompt opened the block; the turn closes it
    if thinking is None and reasoning:
        return f"<think>\n{reasoning}\n</think>\n\n"
    return ""


def render_choice(
    message: Mapping[str, Any],
    finish_reason: str | None,
    params: SamplingParams,
    end_of_message: str,
    stop_kept: bool,
    call_format: CallFormat | None = None,
    thinking: bool | None = None,
) -> tuple[str, StopReason]:
    """The text the local sampler would have produced for one chat choice: calls in
    ``call_format`` (default JSON); ``thinking`` as :func:`thinking_prefill` said of the
    prompt, so reasoning returned apart is put back where the model wrote it."""
    content = message.get("content") or ""
    head = _reasoning_head(message, content, thinking)
    calls = message.get("tool_calls") or []
    if calls:
        if "</tool_call>" in params.stop_strings:
            calls = calls[:1]  # sampling would have stopped after the first call
        parts = [content] if content else []
        for call in calls:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                args = {}  # unusable arguments: the protocol will see an invalid call
            args = args if isinstance(args, dict) else {}
            parts.append((call_format or JsonCallFormat()).render(fn.get("name", ""), args))
        return head + "\n".join(parts), "stop"
    content = head + content
    if finish_reason == "length":
        return content, "length"
    if stop_kept and any(content.endswith(s) for s in params.stop_strings):
        return content, "stop"
    for stop in params.stop_strings:
        tag = re.fullmatch(r"</([^<>/\s]+)>", stop)
        if tag and content.count(f"<{tag.group(1)}>") > content.count(stop):
            return content + stop, "stop"
    return content + end_of_message, "stop"
