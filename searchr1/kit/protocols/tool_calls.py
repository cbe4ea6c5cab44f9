"""Native tool calls through the tokenizer's chat template (``[rollout] protocol =
"tool_calls"``, what Qwen3 / Qwen3.5 chat models are trained for).

The prompt, the call format and the observation splice: docs/agent_protocols.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from searchr1.kit.protocols.call_formats import (
    CALL_CLOSE,
    CALL_OPEN,
    CallFormat,
    JsonCallFormat,
    XmlCallFormat,
    detect_call_format,
)
from searchr1.kit.protocols.thinking import (
    THINK_CLOSE,
    THINK_OPEN,
    prompt_opens_thinking,
    visible_text,
)
from searchr1.sdk import (
    ANSWER_LINE_RE,
    INVALID,
    Action,
    AgentProtocol,
    ConfigValueError,
    Question,
    answer_lines,
)

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

# Placeholders rendered through the chat template to find where message contents go.
_ASSISTANT_MARK = "\x00SEARCHR1_ASSISTANT\x00"
_TOOL_MARK = "\x00SEARCHR1_OBSERVATION\x00"


class ToolCallsProtocol(AgentProtocol):
    """Native ``<tool_call>`` blocks in the template's own format and a final ``Answer:`` line.

    Attributes read off the chat template at construction: :attr:`call_format` (how calls are
    written) and :attr:`opens_in_thinking` (True: the generation prompt ends inside a
    ``<think>`` block; False: it holds a closed one, thinking is off; None: neither)."""

    name = "tool_calls"
    answer_format = "one final `Answer: <short answer>` line"
    stop_strings = (CALL_CLOSE,)  # replaced by the detected format's closing tag
    tags = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)
    #: the formats a chat template may write calls in, tried in order (at most one matches);
    #: a subclass adds a family: ``call_formats = (*ToolCallsProtocol.call_formats, Mine())``
    call_formats: tuple[CallFormat, ...] = (JsonCallFormat(), XmlCallFormat())

    def __init__(self, tokenizer: Any, *, enable_thinking: bool = False):
        super().__init__(tokenizer, enable_thinking=enable_thinking)
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigValueError(
                'rollout.protocol = "tool_calls" needs a tokenizer with a chat template; this '
                'model\'s tokenizer has none (a base model?): use protocol = "tags"'
            )
        self.call_format: CallFormat = detect_call_format(
            lambda m: self._template(m, False), self.call_formats
        )
        self.stop_strings = (self.call_format.close,)
        self.tags = tuple(
            dict.fromkeys((*self.tags, self.call_format.open, self.call_format.close))
        )
        self.opens_in_thinking: bool | None = prompt_opens_thinking(self.generation_prompt)

    def _template(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=[SEARCH_TOOL],
            add_generation_prompt=generation_prompt,
            tokenize=False,
            enable_thinking=self.enable_thinking,
        )

    @cached_property
    def generation_prompt(self) -> str:
        """The text the template appends for ``add_generation_prompt`` (e.g.
        ``<|im_start|>assistant\\n<think>\\n`` for Qwen3.5 with thinking on)."""
        messages = [{"role": "user", "content": "q"}]
        with_prompt, without = self._template(messages, True), self._template(messages, False)
        if with_prompt.startswith(without):
            return with_prompt[len(without) :]
        return with_prompt[-64:]  # a template that rewrites earlier text: its tail will do

    def render_prompt(self, question: Question) -> str:
        content = f"{INSTRUCTION}\n\nQuestion: {question.question.strip()}"
        return self._template([{"role": "user", "content": content}], True)

    # ------------------------------------------------------------------ actions

    def parse_action(self, text: str) -> Action:
        visible = visible_text(text, opens_in_thinking=self.opens_in_thinking is True)
        call = self.call_format.find(visible)
        answer = next((m for m in ANSWER_LINE_RE.finditer(visible) if m.group(1)), None)
        if answer is not None and (call is None or answer.start() < call.start()):
            return Action("answer", answer=answer.group(1).strip())
        if call is None:
            return INVALID
        parsed = self.call_format.parse_body(call.group(1))
        if parsed is None or parsed.name != "search":
            return INVALID
        query = parsed.arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return INVALID
        return Action("search", query=query.strip())

    @classmethod
    def extract_answers(cls, text: str) -> list[str]:
        """``Answer:`` lines outside reasoning, in one turn's text (a turn that starts inside
        a prompt-opened think block is recognised by its unmatched ``</think>``)."""
        return answer_lines(visible_text(text))

    # ------------------------------------------------------------------ observations

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
            raise ConfigValueError(
                "the tokenizer's chat template does not render assistant and tool message "
                "contents verbatim, so searchr1 cannot splice observations in; use "
                'rollout.protocol = "tags"'
            )
        before, after = full.split(_ASSISTANT_MARK, 1)[1].split(_TOOL_MARK, 1)
        return before, after

    @cached_property
    def trims_observations(self) -> bool:
        """Whether the chat template strips whitespace around a tool message's content (the
        official Qwen3.5 template renders ``content | trim``): read off one rendering of a
        tool message padded with spaces and newlines."""
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _ASSISTANT_MARK},
            {"role": "tool", "content": f" \n{_TOOL_MARK} \n"},
        ]
        return f" \n{_TOOL_MARK} \n" not in self._template(messages, True)

    def render_observation_tokens(
        self, body: str, turn_tokens: Sequence[int], max_body_tokens: int
    ) -> tuple[list[int], str]:
        """As the base class, but where the template trims tool content the body is trimmed
        too, after the cut: a body cut on a space then renders ``Doc\n</tool_response>``,
        as the template renders that observation, not ``Doc \n</tool_response>``."""
        if not self.trims_observations:
            return super().render_observation_tokens(body, turn_tokens, max_body_tokens)
        before, after = self.observation_wrapper(turn_tokens)
        cut = self.decode(self.encode(body.strip())[:max_body_tokens], skip_special_tokens=False)
        body_tokens = self.encode(cut.strip())[:max_body_tokens]
        tokens = before + body_tokens + after
        return tokens, self.decode(tokens, skip_special_tokens=False)

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

    # ------------------------------------------------------------------ scripted turns

    def _reasoning(self, think: str | None) -> str:
        """How a turn's reasoning is written under this template's thinking mode: inside the
        block the prompt opened (Qwen3.5), dropped when the prompt closed it (thinking off),
        or as a block of its own (Qwen3 with thinking on)."""
        if self.opens_in_thinking is True:
            return f"{think.strip()}\n{THINK_CLOSE}\n\n" if think else f"\n{THINK_CLOSE}\n\n"
        if self.opens_in_thinking is False or not think:
            return ""
        return f"{THINK_OPEN}\n{think.strip()}\n{THINK_CLOSE}\n\n"

    def assistant_turn_text(
        self, *, think: str | None = None, query: str | None = None, answer: str | None = None
    ) -> str:
        self._one_action(query, answer)
        head = self._reasoning(think)
        if query is not None:
            return head + self.call_format.render("search", {"query": query.strip()})
        return f"{head}Answer: {answer.strip()}{self._end_of_message}"  # type: ignore[union-attr]

    # ------------------------------------------------------------------ description

    def summary(self) -> list[str]:
        thinking = {
            True: "on (the prompt opens a <think> block; the turn's first </think> closes it)",
            False: "off (the prompt holds an empty, closed <think> block)",
            None: "the model may write its own <think> block",
        }[self.opens_in_thinking]
        return [
            "protocol: tool_calls (native tool calls; final answer as one `Answer: ...` line)",
            f"call format: {self.call_format.name} ({self.call_format.families}), read off the "
            "chat template",
            f"expected search call: {self.call_format.example()!r}",
            f"thinking: {thinking}; nothing inside <think>...</think> is read as an action",
        ]
