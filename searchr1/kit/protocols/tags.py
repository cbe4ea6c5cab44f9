"""The Search-R1 tag protocol (``[rollout] protocol = "tags"``).

Prompt rendering, for a :class:`~searchr1.core.types.Question` ``q``::

    user_text = INSTRUCTION + "Question: " + q.question.strip() + "\\n"
    prompt    = tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
                                              add_generation_prompt=True, tokenize=False)
    # a tokenizer without a chat template (a base model) gets user_text itself
    prompt_tokens = tokenizer.encode(prompt, add_special_tokens=False)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property

from searchr1.sdk import INVALID, Action, AgentProtocol, Question, answer_elements

#: Search-R1's instruction (``Search-R1/scripts/data_process/nq_search.py``), verbatim apart
#: from a fixed typo, so prompts match the original project's training data.
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as you want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. "
)

_ELEMENT_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

OBSERVATION_OPEN = "\n\n<information>"
OBSERVATION_CLOSE = "</information>\n\n"


class TagsProtocol(AgentProtocol):
    """Search-R1 tags: ``<search>``, ``<information>``, ``<answer>``."""

    name = "tags"
    answer_format = "one <answer>...</answer> element"
    stop_strings = ("</search>", "</answer>")
    tags = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>")

    def render_prompt(self, question: Question) -> str:
        user_text = f"{INSTRUCTION}Question: {question.question.strip()}\n"
        if not getattr(self.tokenizer, "chat_template", None):
            return user_text
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False
        )

    def parse_action(self, text: str) -> Action:
        match = _ELEMENT_RE.search(text)
        if match is None:
            return INVALID
        kind, inner = match.group(1), match.group(2).strip()
        if kind == "answer":
            return Action("answer", answer=inner)
        return Action("search", query=inner) if inner else INVALID

    @classmethod
    def extract_answers(cls, text: str) -> list[str]:
        return answer_elements(text)

    def summary(self) -> list[str]:
        return [
            "protocol: tags (Search-R1: <search> query </search>, results in <information>, "
            "final <answer> ... </answer>, all inside one assistant message)"
        ]

    @cached_property
    def _wrapper(self) -> tuple[list[int], list[int]]:
        return self.encode(OBSERVATION_OPEN), self.encode(OBSERVATION_CLOSE)

    def observation_wrapper(self, turn_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        before, after = self._wrapper
        return list(before), list(after)

    def assistant_turn_text(
        self, *, think: str | None = None, query: str | None = None, answer: str | None = None
    ) -> str:
        self._one_action(query, answer)
        head = f"<think> {think.strip()} </think>\n" if think else ""
        if query is not None:
            return f"{head}<search> {query.strip()} </search>"
        return f"{head}<answer> {answer.strip()} </answer>"  # type: ignore[union-attr]
