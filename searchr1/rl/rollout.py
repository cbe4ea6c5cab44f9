"""The rollout state machine: generate, search, read, continue, answer (docs/architecture.md
draws it). A prompt is sampled once with ``num_samples = group_size``, then each trajectory
goes on with ``num_samples = 1``: in lockstep with the others (``rollout.lockstep``) or as
its own task. Token-in/token-out: the tokens are the next prompt, never decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import structlog

from searchr1.core.agent_protocol import Action, AgentProtocol
from searchr1.core.errors import ConfigValueError
from searchr1.core.types import (
    EndReason,
    Question,
    SampledSequence,
    Sampler,
    SamplingParams,
    SearchProvider,
    SearchResponse,
    Trajectory,
    Turn,
)

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

T = TypeVar("T")


class RolloutConfigError(ConfigValueError):
    """A question's prompt alone fills ``[rollout] max_trajectory_tokens`` (exit code 2)."""


def prompt_overflow(protocol: AgentProtocol, question: Question, limit: int) -> str | None:
    """Why ``question`` cannot be rolled out under ``rollout.max_trajectory_tokens = limit``
    (its prompt alone fills it), or None."""
    size = len(protocol.initial_prompt_tokens(question))
    return _overflow(question, size, limit) if size >= limit else None


def _overflow(question: Question, size: int, limit: int) -> str:
    return (
        f"question {question.id!r}: the prompt alone has {size} tokens, no room left in "
        f"rollout.max_trajectory_tokens = {limit}"
    )


def sampling_params(
    config: Config, protocol: AgentProtocol, *, greedy: bool = False
) -> SamplingParams:
    """Per-turn sampling: ``[model] temperature/top_p/max_new_tokens`` and the protocol's stop
    strings and token ids; ``greedy`` (eval) sets temperature 0, top_p 1."""
    return SamplingParams(
        max_tokens=config.model.max_new_tokens,
        temperature=0.0 if greedy else config.model.temperature,
        top_p=1.0 if greedy else config.model.top_p,
        stop_strings=tuple(protocol.stop_strings),
        stop_token_ids=tuple(protocol.stop_token_ids),
    )


def derived_seed(seed: int, key: str) -> int:
    """The seed of ``key`` (a request, a train step's draw) under ``seed``: independent of
    batching, concurrency and resumes."""
    digest = hashlib.sha256(f"{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


@dataclass
class _State:
    """One trajectory in progress (owned by exactly one asyncio task)."""

    question: Question
    trajectory_id: str
    group_id: str
    prompt_len: int
    tokens: list[int]
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    search_calls: int = 0
    search_errors: int = 0


class _Rollout:
    """The shared, read-only context of one :func:`rollout_questions` call."""

    def __init__(
        self,
        model: Sampler,
        search: SearchProvider,
        protocol: AgentProtocol,
        config: Config,
        sampling: SamplingParams,
    ):
        self.model, self.search, self.protocol = model, search, protocol
        self.limits = config.rollout
        self.top_k = config.search.top_k
        self.sampling = sampling

    def _params(self, used: int, request_key: str, group_id: str) -> SamplingParams:
        """``max_tokens`` shrunk to the budget left, the ``group_id``, and a seed derived from
        ``request_key`` (a shared one would give every ``num_samples=1`` request one stream)."""
        left = self.limits.max_trajectory_tokens - used
        seed = self.sampling.seed
        if seed is not None:
            seed = derived_seed(seed, request_key)
        return dataclasses.replace(
            self.sampling,
            max_tokens=min(self.sampling.max_tokens, left),
            seed=seed,
            group_id=group_id,
        )

    def _prompt(self, question: Question) -> list[int]:
        prompt = self.protocol.initial_prompt_tokens(question)
        if len(prompt) >= self.limits.max_trajectory_tokens:
            raise RolloutConfigError(
                _overflow(question, len(prompt), self.limits.max_trajectory_tokens)
            )
        return prompt

    async def _first(
        self, prompt: list[int], group_size: int, group_id: str, question: Question
    ) -> list[tuple[_State, SampledSequence]]:
        """The group's first turns, sampled at once, as ``(state, sample)`` pairs."""
        first = await self.model.sample(
            prompt, group_size, self._params(len(prompt), f"{group_id}/first", group_id)
        )
        if len(first) != group_size:
            raise RuntimeError(
                f"model provider returned {len(first)} samples for num_samples={group_size}"
            )
        return [
            (
                _State(
                    question=question,
                    trajectory_id=f"{group_id}/{i}",
                    group_id=group_id,
                    prompt_len=len(prompt),
                    tokens=list(prompt),
                    mask=[False] * len(prompt),
                    logprobs=[0.0] * len(prompt),
                ),
                sample,
            )
            for i, sample in enumerate(first)
        ]

    async def group(self, question: Question, group_size: int, group_id: str) -> list[Trajectory]:
        """One group, each trajectory advancing on its own."""
        pairs = await self._first(self._prompt(question), group_size, group_id, question)
        return await _gather_or_cancel([self.advance(s, sample) for s, sample in pairs])

    async def advance(self, state: _State, sample: SampledSequence) -> Trajectory:
        """Drive one trajectory from its first sampled turn to its end."""
        while True:
            turn, done = self._read(state, sample)
            if done is not None:
                return done
            response = await self._search(turn.query or "")
            done = self._observe(state, turn, sample, response)
            if done is not None:
                return done
            sample = _one(await self.model.sample(list(state.tokens), 1, self._next_params(state)))

    async def lockstep(
        self,
        questions: Sequence[Question],
        group_size: int,
        id_prefix: str,
        on_group_done: Callable[[], None] | None,
    ) -> list[list[Trajectory]]:
        """Every group, a turn at a time: all live trajectories sample (queued together, in
        question and sample order), then all search; so the questions and the seed, not the
        searches' timing, fix what shares a sampler batch."""
        prompts = [self._prompt(q) for q in questions]
        firsts = await _gather_or_cancel(
            [
                self._first(p, group_size, f"{id_prefix}{q.id}", q)
                for q, p in zip(questions, prompts, strict=True)
            ]
        )
        out: list[list[Trajectory | None]] = [[None] * group_size for _ in questions]
        left = [group_size] * len(questions)

        def finish(g: int, i: int, trajectory: Trajectory) -> None:
            out[g][i] = trajectory
            left[g] -= 1
            if left[g] == 0 and on_group_done is not None:
                on_group_done()

        live = [
            (g, i, s, sample)
            for g, pairs in enumerate(firsts)
            for i, (s, sample) in enumerate(pairs)
        ]
        while live:
            searching = []
            for g, i, state, sample in live:
                turn, done = self._read(state, sample)
                if done is not None:
                    finish(g, i, done)
                else:
                    searching.append((g, i, state, sample, turn))
            responses = await _gather_or_cancel(
                [self._search(turn.query or "") for *_, turn in searching]
            )
            going = []
            for (g, i, state, sample, turn), response in zip(searching, responses, strict=True):
                done = self._observe(state, turn, sample, response)
                if done is not None:
                    finish(g, i, done)
                else:
                    going.append((g, i, state))
            samples = await _gather_or_cancel(
                [
                    self.model.sample(list(state.tokens), 1, self._next_params(state))
                    for _, _, state in going
                ]
            )
            live = [
                (g, i, state, _one(drawn))
                for (g, i, state), drawn in zip(going, samples, strict=True)
            ]
        return [[t for t in group if t is not None] for group in out]

    def _read(self, state: _State, sample: SampledSequence) -> tuple[Turn, Trajectory | None]:
        """Append the sampled turn to ``state``: the turn, and the trajectory when the turn
        ends it (else the turn's query is to be searched)."""
        if len(sample.tokens) != len(sample.logprobs):
            raise RuntimeError(
                f"{state.trajectory_id}: model provider returned {len(sample.tokens)} "
                f"tokens but {len(sample.logprobs)} log-probs"
            )
        state.tokens.extend(sample.tokens)
        state.mask.extend([True] * len(sample.tokens))
        state.logprobs.extend(float(x) for x in sample.logprobs)
        text = self.protocol.decode(sample.tokens)
        action = self.protocol.parse_action(text)
        turn = Turn(
            sampled_tokens=tuple(sample.tokens),
            text=text,
            action=action.kind,
            query=action.query,
            stop_reason=sample.stop_reason,
        )
        left = self.limits.max_trajectory_tokens - len(state.tokens)
        if action.kind == "answer":
            return turn, self._finish(state, turn, "answered", action)
        if left <= 0:
            return turn, self._finish(state, turn, "token_limit")
        if action.kind == "invalid":
            return turn, self._finish(state, turn, "invalid_action")
        if state.search_calls >= self.limits.max_search_calls:
            return turn, self._finish(state, turn, "search_limit")
        if len(state.turns) + 1 >= self.limits.max_assistant_turns:
            return turn, self._finish(state, turn, "turn_limit")
        return turn, None

    def _observe(
        self, state: _State, turn: Turn, sample: SampledSequence, response: SearchResponse
    ) -> Trajectory | None:
        """Append the search's observation to ``state``; the trajectory when it leaves no room."""
        state.search_calls += 1
        state.search_errors += response.error is not None
        body = self.protocol.observation_text(response)
        obs_tokens, obs_text = self.protocol.render_observation_tokens(
            body, sample.tokens, self.limits.max_observation_tokens
        )
        turn = dataclasses.replace(turn, search_error=response.error)
        if len(state.tokens) + len(obs_tokens) >= self.limits.max_trajectory_tokens:
            return self._finish(state, turn, "token_limit")
        state.tokens.extend(obs_tokens)
        state.mask.extend([False] * len(obs_tokens))
        state.logprobs.extend([0.0] * len(obs_tokens))
        state.turns.append(
            dataclasses.replace(
                turn, observation_tokens=tuple(obs_tokens), observation_text=obs_text
            )
        )
        return None

    def _next_params(self, state: _State) -> SamplingParams:
        return self._params(
            len(state.tokens), f"{state.trajectory_id}/turn{len(state.turns)}", state.group_id
        )

    async def _search(self, query: str) -> SearchResponse:
        """One search; a provider that raises (it should not) becomes an error observation."""
        try:
            return await self.search.search(query, self.top_k)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the contract says never raise; never let one crash a batch
            structlog.get_logger().warning("search_raised", error=f"{type(exc).__name__}: {exc}")
            return SearchResponse(error=f"{type(exc).__name__}")

    def _finish(
        self, state: _State, turn: Turn, reason: EndReason, action: Action | None = None
    ) -> Trajectory:
        state.turns.append(turn)
        q = state.question
        final_answer = action.answer if action is not None else None
        return Trajectory(
            trajectory_id=state.trajectory_id,
            question=q.question,
            golden_answers=tuple(q.golden_answers),
            tokens=tuple(state.tokens),
            generated_mask=tuple(state.mask),
            logprobs=tuple(state.logprobs),
            prompt_len=state.prompt_len,
            turns=tuple(state.turns),
            end_reason=reason,
            final_answer=final_answer,
            final_text=self.protocol.decode(
                state.tokens[state.prompt_len :], skip_special_tokens=False
            ),
            search_calls=state.search_calls,
            search_errors=state.search_errors,
            data_source=q.data_source,
            group_id=state.group_id,
            format_ok=self.protocol.answered_in_format([t.text for t in state.turns], final_answer),
        )


def _one(samples: list[SampledSequence]) -> SampledSequence:
    if len(samples) != 1:
        raise RuntimeError(f"model provider returned {len(samples)} samples for num_samples=1")
    return samples[0]


async def _gather_or_cancel(
    coros: Sequence[Awaitable[T]], on_done: Callable[[], None] | None = None
) -> list[T]:
    """Results in order; on the first exception cancel the rest and re-raise it (a broken
    model channel stops the batch at once). ``on_done()`` after each one that succeeds."""
    if not coros:  # asyncio.wait refuses an empty set (a torchrun rank's empty share)
        return []
    tasks = [asyncio.ensure_future(c) for c in coros]
    for task in tasks if on_done is not None else ():
        task.add_done_callback(
            lambda t: on_done() if not t.cancelled() and t.exception() is None else None
        )
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    # Read every failure: an unread one makes asyncio print "exception was never retrieved".
    errors = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]
    return [t.result() for t in tasks]


async def rollout_questions(
    model: Sampler,
    search: SearchProvider,
    protocol: AgentProtocol,
    questions: Sequence[Question],
    config: Config,
    *,
    group_size: int,
    sampling: SamplingParams | None = None,
    id_prefix: str = "",
    on_group_done: Callable[[], None] | None = None,
) -> list[list[Trajectory]]:
    """``group_size`` trajectories per question, one list per question in order; ids are
    ``{id_prefix}{question.id}/{i}``. ``sampling`` (default :func:`sampling_params`) caps each
    turn. A search failure becomes an observation; a sampler error cancels the batch and
    propagates. ``on_group_done()`` is called as each group finishes."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    runner = _Rollout(
        model, search, protocol, config, sampling or sampling_params(config, protocol)
    )
    if config.rollout.lockstep:
        return await runner.lockstep(questions, group_size, id_prefix, on_group_done)
    return await _gather_or_cancel(
        [runner.group(q, group_size, f"{id_prefix}{q.id}") for q in questions], on_group_done
    )
