"""The agent protocol interface: question -> prompt, assistant turn -> action, search result
-> tokens. Nothing outside a protocol class knows its answer format. Token-in/token-out:
decoding only *reads* a turn, it is never re-encoded."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Literal

from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import Question, SearchResponse, Tokenizer

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class Action:
    """One turn's request: a search (``query``), a final answer (``answer``, possibly
    empty), or nothing parsable."""

    kind: ActionKind
    query: str | None = None
    answer: str | None = None


INVALID = Action("invalid")


def format_search_results(response: SearchResponse) -> str:
    """The observation body in Search-R1's layout, ``Doc 1(Title: ...) text`` lines; a failed
    search reads ``search failed: <reason>`` so the model sees why there is no information."""
    if response.error is not None:
        return f"search failed: {response.error}"
    if not response.results:
        return "no results"
    return "\n".join(
        f"Doc {i}(Title: {r.title.strip()}) {' '.join(r.text.split())}"
        for i, r in enumerate(response.results, start=1)
    )


def special_stop_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Ids ending an assistant message: eos and ``<|im_end|>``. Explicit because a chat
    model's end-of-turn token is often not its ``eos_token_id``."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    unk = getattr(tokenizer, "unk_token_id", None)
    if convert is not None:
        for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            tid = convert(token)
            if isinstance(tid, int) and tid != unk and tid not in ids:
                ids.append(tid)
    return tuple(ids)


class AgentProtocol(ABC):
    """How the policy talks to the environment. One instance per run, shared by every
    concurrent trajectory, so no per-trajectory state. Subclasses set :attr:`name` (the
    ``[rollout] protocol`` value), :attr:`answer_format`, :attr:`stop_strings`."""

    name: ClassVar[str]
    #: the final answer the format reward expects, as a person reads it (smoke's verdict)
    answer_format: ClassVar[str]
    stop_strings: tuple[str, ...] = ()
    #: markup the parser reads; kept by :meth:`decode` even if the tokenizer marks it special
    tags: tuple[str, ...] = ()

    def __init__(self, tokenizer: Tokenizer, *, enable_thinking: bool = False):
        self.tokenizer = tokenizer
        #: ``[rollout] enable_thinking``, for protocols that render through the chat template
        self.enable_thinking = enable_thinking
        self.stop_token_ids: tuple[int, ...] = special_stop_ids(tokenizer)

    def encode(self, text: str) -> list[int]:
        """Encode without adding BOS/EOS (special tokens in ``text`` still map to their ids)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Decode for reading, never re-encoded. Keeps :attr:`tags` even when skipping
        special tokens, else ``</think>`` would vanish and every action read as invalid."""
        kept = self._special_tags if skip_special_tokens else {}
        if not kept:
            return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)
        out: list[str] = []
        run: list[int] = []
        for t in tokens:
            if t in kept:
                out += [self.tokenizer.decode(run, skip_special_tokens=True), kept[t]]
                run = []
            else:
                run.append(t)
        out.append(self.tokenizer.decode(run, skip_special_tokens=True))
        return "".join(out)

    @cached_property
    def _special_tags(self) -> dict[int, str]:
        """Single-token tags that skipping special tokens would drop, by id."""
        out: dict[int, str] = {}
        for tag in self.tags:
            ids = self.encode(tag)
            if len(ids) == 1 and not self.tokenizer.decode(ids, skip_special_tokens=True):
                out[ids[0]] = tag
        return out

    @abstractmethod
    def render_prompt(self, question: Question) -> str:
        """The full prompt text (chat template and generation prompt included)."""

    def initial_prompt_tokens(self, question: Question) -> list[int]:
        """``encode(render_prompt(question))``."""
        return self.encode(self.render_prompt(question))

    def summary(self) -> list[str]:
        """Lines saying what the model is expected to write (``searchr1 smoke`` prints them)."""
        return [f"protocol: {self.name}"]

    def describe(self, question: Question) -> str:
        """:meth:`summary` and the rendered first prompt, to check before training."""
        prompt = self.render_prompt(question)
        # Verbatim, end marked not stripped: where the prompt stops (open <think>?) matters.
        return "\n".join([*self.summary(), "rendered prompt:", prompt + "[end of prompt]"])

    @abstractmethod
    def parse_action(self, text: str) -> Action:
        """Read one assistant turn (decoded with special tokens skipped) into an action."""

    @classmethod
    @abstractmethod
    def extract_answers(cls, text: str) -> list[str]:
        """Every final answer in one turn's text (the format reward needs exactly one). A
        class method so rewards need no tokenizer."""

    @classmethod
    def answered_in_format(cls, turn_texts: Sequence[str], final_answer: str | None) -> bool:
        """The one rule for "answered in this protocol's format", applied by the rollout when a
        trajectory ends (recorded as :attr:`~searchr1.core.types.Trajectory.format_ok`, which the format reward,
        health, eval and smoke read): a non-empty final answer, and exactly one non-empty
        answer across the trajectory's turns (``turn_texts``) as :meth:`extract_answers` reads
        them (a turn's reasoning is its own, so answers are read per turn)."""
        answers = [a for text in turn_texts for a in cls.extract_answers(text)]
        final = (final_answer or "").strip()
        return bool(final) and len(answers) == 1 and bool(answers[0])

    def observation_text(self, response: SearchResponse) -> str:
        """The observation body for one search response (before truncation)."""
        return format_search_results(response)

    @abstractmethod
    def observation_wrapper(self, turn_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """Tokens before and after the observation body (a chat protocol closes the
        assistant message unless the model already did)."""

    def render_observation_tokens(
        self, body: str, turn_tokens: Sequence[int], max_body_tokens: int
    ) -> tuple[list[int], str]:
        """``(tokens, text)`` appended after a search turn. ``body`` is cut to
        ``max_body_tokens``, the wrapper never, so the closing tag is always seen. ``text``
        is what the policy saw."""
        before, after = self.observation_wrapper(turn_tokens)
        body_tokens = self.encode(body)[:max_body_tokens]
        tokens = before + body_tokens + after
        return tokens, self.decode(tokens, skip_special_tokens=False)

    @abstractmethod
    def assistant_turn_text(
        self, *, think: str | None = None, query: str | None = None, answer: str | None = None
    ) -> str:
        """One well-formed assistant turn: optional reasoning, then exactly one of ``query``
        or ``answer``, ending where the sampler would stop."""

    def assistant_turn_tokens(
        self, *, think: str | None = None, query: str | None = None, answer: str | None = None
    ) -> list[int]:
        """``encode(assistant_turn_text(...))``, appended as the rollout appends sampled tokens."""
        return self.encode(self.assistant_turn_text(think=think, query=query, answer=answer))

    @staticmethod
    def _one_action(query: str | None, answer: str | None) -> None:
        if (query is None) == (answer is None):
            raise ValueError("a scripted assistant turn needs exactly one of query= or answer=")


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
