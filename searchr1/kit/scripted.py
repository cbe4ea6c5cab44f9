"""A weightless :class:`~searchr1.core.types.Sampler` whose turns a script writes: the base of
scripted agents (a cold start's teacher, an asset's ceiling agent). It runs through the normal
rollout, so its trajectories get the run's search, protocol, template, limits and RL masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.core.types import SampledSequence, SamplingParams


class ScriptedSampler:
    """A Sampler writing :meth:`next_turn` as its turn; subclasses decide it from the
    conversation so far."""

    def __init__(self, tokenizer: Any, protocol: Any):
        self._tokenizer = tokenizer
        self.protocol = protocol

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def next_turn(self, prompt_text: str) -> str:
        """The next turn's text after ``prompt_text`` (prompt, turns, results)."""
        raise NotImplementedError

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
