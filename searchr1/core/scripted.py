"""Weightless :class:`~searchr1.core.types.Sampler` s whose turns a script writes: the base of
scripted agents (:class:`ScriptedSampler`, also an asset's ceiling agent) and the cold start's
teacher on any QA data (:class:`ScriptedTeacher`). They run through the normal rollout, so their
trajectories get the run's search, protocol, template, limits and RL masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.core.answers import normalize_answer
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import SampledSequence, SamplingParams

#: what a scripted agent answers when what it read does not hold the answer (scores wrong)
UNKNOWN = "unknown"


class ScriptedSampler:
    """A Sampler writing :meth:`next_turn` as its turn for the ``questions`` it was given
    (anything with a ``question`` text); subclasses decide it from the conversation so far."""

    #: who it is and which questions it plays, for the error about any other question
    role, plays = "the scripted sampler", "among those it was given"

    def __init__(self, tokenizer: Any, protocol: Any, questions: Sequence[Any]):
        self._tokenizer = tokenizer
        self.protocol = protocol
        # Longest first, so a question that contains another is located as itself.
        self._questions = sorted(
            {q.question.strip(): q for q in questions}.items(), key=lambda kv: -len(kv[0])
        )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def next_turn(self, prompt_text: str) -> str:
        """The next turn's text after ``prompt_text`` (prompt, turns, results)."""
        raise NotImplementedError

    def _locate(self, prompt_text: str) -> tuple[Any, str]:
        """The question ``prompt_text`` asks and the text after it (turns and results)."""
        for text, question in self._questions:
            at = prompt_text.find(text)
            if at >= 0:
                return question, prompt_text[at + len(text) :]
        raise ValueError(
            f"{self.role} was asked about a question that is not {self.plays} (prompt starts "
            f"{prompt_text[:120]!r})"
        )

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        text = self._tokenizer.decode(list(prompt_tokens), skip_special_tokens=False)
        tokens = tuple(self._tokenizer.encode(self.next_turn(text), add_special_tokens=False))
        stop = "stop"
        if len(tokens) > params.max_tokens:
            tokens, stop = tokens[: params.max_tokens], "length"
        return [SampledSequence(tokens, (0.0,) * len(tokens), stop)] * num_samples  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing to release."""


class ScriptedTeacher(ScriptedSampler):
    """Per question: turn 1 searches the question's own text; turn 2 answers the first golden
    answer the results contain (normalised exact match), else :data:`UNKNOWN`, which scores
    wrong and is dropped, so only searches that found the answer are imitated."""

    role = "the scripted teacher"

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


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
