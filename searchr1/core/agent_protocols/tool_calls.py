"""Native tool calls through the tokenizer's chat template (``[rollout] protocol =
"tool_calls"``, what Qwen3 / Qwen3.5 chat models are trained for).

Prompt rendering, for a :class:`~searchr1.core.types.Question` ``q``::

    messages = [{"role": "user", "content": INSTRUCTION + "\\n\\nQuestion: " + q.question.strip()}]
    prompt = tokenizer.apply_chat_template(messages, tools=[SEARCH_TOOL],
                                           add_generation_prompt=True, tokenize=False)
    prompt_tokens = tokenizer.encode(prompt, add_special_tokens=False)

The model calls search with ``<tool_call>\\n{"name": "search", "arguments": {"query": "..."}}
\\n</tool_call>`` (sampling stops at ``</tool_call>``). The environment closes the assistant
message and adds the observation as a ``role: tool`` message, rendered by the same chat
template (for Qwen: ``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response>
<|im_end|>\\n<|im_start|>assistant\\n``). The final answer is one line ``Answer: <short
answer>`` and the message ends with the end-of-message token (``<|im_end|>``), which the
sampler keeps. The earliest of a complete tool call and an ``Answer:`` line decides a turn's
action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from searchr1.core.agent_protocols.base import INVALID, Action, AgentProtocol
from searchr1.core.answers import ANSWER_LINE_RE, answer_lines
from searchr1.core.types import Question

INSTRUCTION = (
    "Answer the question. Call the search tool whenever you need facts you are not sure "
    "about; you may search several times. When you know the answer, write it as the last "
    "line, exactly in the form `Answer: <short answer>`."
)

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web and return the top passages for a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to search for"}},
            "required": ["query"],
        },
    },
}

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

# Placeholders rendered through the chat template to find where message contents go.
_ASSISTANT_MARK = "\x00SEARCHR1_ASSISTANT\x00"
_TOOL_MARK = "\x00SEARCHR1_OBSERVATION\x00"


def parse_tool_call(body: str) -> str | None:
    """The search query of one ``<tool_call>`` body, or None when it is not a well-formed
    call of the ``search`` tool with a non-empty string ``query``."""
    try:
        call = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") != "search":
        return None
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    query = args.get("query") if isinstance(args, dict) else None
    if not isinstance(query, str) or not query.strip():
        return None
    return query.strip()


class ToolCallsProtocol(AgentProtocol):
    """Native ``<tool_call>`` blocks and a final ``Answer:`` line."""

    name = "tool_calls"
    stop_strings = ("</tool_call>",)

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                'rollout.protocol = "tool_calls" needs a tokenizer with a chat template; this '
                'model\'s tokenizer has none (a base model?): use protocol = "tags"'
            )

    def _template(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=[SEARCH_TOOL], add_generation_prompt=generation_prompt, tokenize=False
        )

    def render_prompt(self, question: Question) -> str:
        content = f"{INSTRUCTION}\n\nQuestion: {question.question.strip()}"
        return self._template([{"role": "user", "content": content}], True)

    def parse_action(self, text: str) -> Action:
        call = _TOOL_CALL_RE.search(text)
        answer = next((m for m in ANSWER_LINE_RE.finditer(text) if m.group(1)), None)
        if answer is not None and (call is None or answer.start() < call.start()):
            return Action("answer", answer=answer.group(1).strip())
        if call is None:
            return INVALID
        query = parse_tool_call(call.group(1))
        return INVALID if query is None else Action("search", query=query)

    def extract_answers(self, text: str) -> list[str]:
        return answer_lines(text)

    @cached_property
    def _template_parts(self) -> tuple[str, str]:
        """Read off the chat template: the text from the end of an assistant message's content
        to the tool observation (closing the message, opening the tool turn), and the text
        after the observation up to and including the next assistant generation prompt.

        Taken from one rendering of ``[user, assistant, tool]`` rather than by diffing two
        renderings, because templates such as Qwen3's render the *last* assistant message
        differently (an empty think block) from one that is followed by a tool message."""
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _ASSISTANT_MARK},
            {"role": "tool", "content": _TOOL_MARK},
        ]
        full = self._template(messages, True)
        if _ASSISTANT_MARK not in full or _TOOL_MARK not in full.split(_ASSISTANT_MARK, 1)[1]:
            raise ValueError(
                "the tokenizer's chat template does not render assistant and tool message "
                "contents verbatim, so searchr1 cannot splice observations in; use "
                'rollout.protocol = "tags"'
            )
        before, after = full.split(_ASSISTANT_MARK, 1)[1].split(_TOOL_MARK, 1)
        return before, after

    @cached_property
    def _encoded_parts(self) -> tuple[list[int], list[int]]:
        before, after = self._template_parts
        return self.encode(before), self.encode(after)

    def observation_wrapper(self, turn_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        before, after = self._encoded_parts
        if turn_tokens and turn_tokens[-1] in self.stop_token_ids:
            # The model already ended its message: add only what follows its end token.
            before_text = self._template_parts[0]
            end_text = self.decode([turn_tokens[-1]], skip_special_tokens=False)
            if end_text and before_text.startswith(end_text):
                rest = before_text[len(end_text) :]
                before = self.encode(rest) if rest else []
        return list(before), list(after)

    @cached_property
    def _end_of_message(self) -> str:
        """The text of the token that ends an assistant message (``<|im_end|>``)."""
        before_text = self._template_parts[0]
        for tid in self.stop_token_ids:
            text = self.decode([tid], skip_special_tokens=False)
            if text and before_text.startswith(text):
                return text
        return ""

    def assistant_turn_text(
        self, *, think: str | None = None, query: str | None = None, answer: str | None = None
    ) -> str:
        self._one_action(query, answer)
        head = f"<think>\n{think.strip()}\n</think>\n\n" if think else ""
        if query is not None:
            call = json.dumps(
                {"name": "search", "arguments": {"query": query.strip()}}, ensure_ascii=False
            )
            return f"{head}<tool_call>\n{call}\n</tool_call>"
        return f"{head}Answer: {answer.strip()}{self._end_of_message}"  # type: ignore[union-attr]
