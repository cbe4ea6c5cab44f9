"""The scripted agent the cold start imitates on any QA data. Per question::

    turn 1: search the question's own text
    turn 2: answer the first golden answer the results contain (normalised exact match,
            searchr1.core.answers.normalize_answer), else "unknown"

A :class:`~searchr1.kit.scripted.ScriptedSampler`. "unknown" scores
wrong and is dropped, so only searches that found the answer are imitated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.core.answers import normalize_answer
from searchr1.core.types import Question
from searchr1.kit.scripted import ScriptedSampler

#: what the teacher answers when the results do not hold a golden answer
UNKNOWN = "unknown"


class ScriptedTeacher(ScriptedSampler):
    """Search the question, answer from the results; plays the ``questions`` it is given."""

    def __init__(self, tokenizer: Any, protocol: Any, questions: Sequence[Question]):
        super().__init__(tokenizer, protocol)
        # Longest first, so a question that contains another is located as itself.
        self._questions = sorted(
            {q.question.strip(): q for q in questions}.items(), key=lambda kv: -len(kv[0])
        )

    def next_turn(self, prompt_text: str) -> str:
        question, read = self._locate(prompt_text)
        search_turn = self.protocol.assistant_turn_text(query=question.question.strip())
        if search_turn not in read:
            return search_turn
        results = normalize_answer(read.split(search_turn, 1)[1])
        for answer in question.golden_answers:
            if normalize_answer(answer) and normalize_answer(answer) in results:
                return self.protocol.assistant_turn_text(answer=answer)
        return self.protocol.assistant_turn_text(answer=UNKNOWN)

    def _locate(self, prompt_text: str) -> tuple[Question, str]:
        for text, question in self._questions:
            at = prompt_text.find(text)
            if at >= 0:
                return question, prompt_text[at + len(text) :]
        raise ValueError(
            f"the scripted teacher was asked about a question it was not given (prompt starts "
            f"{prompt_text[:120]!r})"
        )
