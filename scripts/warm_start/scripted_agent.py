"""Scripted trajectories of a realistic *untrained* search agent on the generated world.

A base model asked to use a search engine does so only some of the time: it often answers
from a guess, sometimes searches with a vague query (the question's words without the name it
is about), and on two-hop questions often stops after the first hop. The scripted agent here
does exactly that, with fixed per-type rates (:class:`Behaviour`); what it reads is real (the
search provider it is given, the ``local`` BM25 one over the world corpus in the warm start),
and when it answers after a search it copies from the first result, right or wrong.

Every scripted trajectory is rendered with the rollout's own protocol code
(``initial_prompt_tokens``, ``assistant_turn_tokens``, ``observation_text``,
``render_observation_tokens``), so the fine-tune sees token-for-token what the rollout will
produce; :class:`Episode` marks which tokens the agent "generated". The warm start
(``scripts/build_warm_start.py``) fine-tunes on these episodes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from searchr1.core.types import Question, SearchProvider
from searchr1.plugins.offline_world.generate import Entity, World, WorldQuestion

if TYPE_CHECKING:
    from searchr1.core.agent_protocol import AgentProtocol
    from searchr1.core.config_schema import Config

#: What each fact relation reads from an entity: relation -> (entity kind, fact key).
_RELATIONS: dict[str, tuple[str, str]] = {
    "born_city": ("person", "born_city"),
    "born_year": ("person", "born_year"),
    "founder": ("org", "founder"),
    "country": ("city", "country"),
}
#: The relation chain of each question type (one relation per hop).
CHAINS: dict[str, tuple[str, ...]] = {
    "born_city": ("born_city",),
    "born_year": ("born_year",),
    "founder": ("founder",),
    "city_country": ("country",),
    "born_country": ("born_city", "country"),
    "founder_city": ("founder", "born_city"),
}
#: The kind of thing each question type asks for (what a guess looks like).
_ANSWER_KIND: dict[str, str] = {
    "born_city": "city",
    "born_year": "year",
    "founder": "person",
    "city_country": "country",
    "born_country": "country",
    "founder_city": "city",
}


@dataclass(frozen=True)
class Behaviour:
    """The scripted untrained agent's tendencies (probabilities per trajectory).

    ``first_search[qtype]``: searches at all (else answers a guess of the right kind); the
    rates differ by type, as a base model's confidence does. ``poor_query``: a search uses the
    question's words without the name it is about (BM25 then returns unrelated documents).
    ``second_search``: on a two-hop question, searches the name read in the first result
    (else stops: ``answer_bridge`` of the time it answers that name, otherwise it guesses).
    """

    first_search: Mapping[str, float] = field(
        default_factory=lambda: {
            "born_city": 0.6,
            "founder": 0.55,
            "born_year": 0.35,
            "city_country": 0.3,
            "born_country": 0.5,
            "founder_city": 0.4,
        }
    )
    poor_query: float = 0.3
    second_search: float = 0.45
    answer_bridge: float = 0.5


@dataclass(frozen=True)
class ScriptedTurn:
    """One scripted assistant action: a search ``query`` or a final ``answer``."""

    query: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class Episode:
    """A rendered scripted trajectory: all tokens and which of them the model "generated"
    (the only positions the fine-tune's loss covers)."""

    tokens: list[int]
    train_mask: list[bool]
    turns: list[ScriptedTurn]
    question: WorldQuestion
    #: where the search results are (trained on only for a ``reading`` episode)
    observation_mask: list[bool] = field(default_factory=list)
    #: an episode of the *reading* world: its observations are trained on too (see
    #: :func:`build_warm_start`)
    reading: bool = False


def read_fact(relation: str, entity: Entity | None, world: World) -> str:
    """What an agent copying from a result about ``entity`` answers for ``relation``.

    The right fact when ``entity`` has it; otherwise (the result is about something else)
    the first name or number its document mentions, as a copying agent would."""
    if entity is None:
        return ""
    kind, key = _RELATIONS[relation]
    facts = entity.facts
    if entity.kind == kind:
        value = facts[key]
    else:
        order = {
            "person": ("born_city", "born_year"),
            "org": ("founder", "year", "city"),
            "city": ("country",),
            "country": ("capital",),
        }[entity.kind]
        value = facts[order[0]]
    return world.entities[value].name if value in world.entities else value


def poor_query(question: WorldQuestion) -> str:
    """The question's own words without the name it is about (a vague first query)."""
    words = question.question.replace(question.hops[0], " ").rstrip("?").split()
    return " ".join(words)


class _Guesser:
    """Random answers of the right kind, drawn from the training side of the world only."""

    def __init__(self, world: World):
        self.names: dict[str, list[str]] = {}
        for e in world.entities.values():
            if e.id not in world.heldout_entities:
                self.names.setdefault(e.kind, []).append(e.name)

    def guess(self, kind: str, rng: random.Random) -> str:
        if kind == "year":
            return str(rng.randint(1650, 2000))
        return rng.choice(self.names[kind])


async def script_episode(
    question: WorldQuestion,
    world: World,
    protocol: AgentProtocol,
    search: SearchProvider,
    config: Config,
    rng: random.Random,
    behaviour: Behaviour,
    guesser: _Guesser,
) -> Episode:
    """Play the untrained agent on one question against the real search provider and render
    the trajectory with the rollout's protocol code (prompt, turns, observations)."""
    by_name = world.by_name()
    q = Question(question.id, question.question, (question.answer,), question.data_source, {})
    tokens = protocol.initial_prompt_tokens(q)
    mask = [False] * len(tokens)
    observed = [False] * len(tokens)
    turns: list[ScriptedTurn] = []

    def emit(turn: ScriptedTurn) -> list[int]:
        turn_tokens = protocol.assistant_turn_tokens(query=turn.query, answer=turn.answer)
        tokens.extend(turn_tokens)
        mask.extend([True] * len(turn_tokens))
        observed.extend([False] * len(turn_tokens))
        turns.append(turn)
        return turn_tokens

    async def search_and_read(query: str, relation: str) -> str:
        turn_tokens = emit(ScriptedTurn(query=query))
        response = await search.search(query, config.search.top_k)
        obs, _ = protocol.render_observation_tokens(
            protocol.observation_text(response), turn_tokens, config.rollout.max_observation_tokens
        )
        tokens.extend(obs)
        mask.extend([False] * len(obs))
        observed.extend([True] * len(obs))
        first = by_name.get(response.results[0].title) if response.results else None
        return read_fact(relation, first, world)

    chain = CHAINS[question.qtype]
    kind = _ANSWER_KIND[question.qtype]
    if rng.random() >= behaviour.first_search[question.qtype]:
        emit(ScriptedTurn(answer=guesser.guess(kind, rng)))
    else:
        good = rng.random() >= behaviour.poor_query
        read = await search_and_read(question.hops[0] if good else poor_query(question), chain[0])
        if len(chain) == 1:
            emit(ScriptedTurn(answer=read or guesser.guess(kind, rng)))
        elif rng.random() < behaviour.second_search and read:
            good = rng.random() >= behaviour.poor_query
            second = await search_and_read(read if good else question.hops[0], chain[1])
            emit(ScriptedTurn(answer=second or guesser.guess(kind, rng)))
        elif rng.random() < behaviour.answer_bridge and read:
            emit(ScriptedTurn(answer=read))
        else:
            emit(ScriptedTurn(answer=guesser.guess(kind, rng)))
    return Episode(tokens, mask, turns, question, observed)


async def script_episodes(
    world: World,
    questions: Sequence[WorldQuestion],
    protocol: AgentProtocol,
    search: SearchProvider,
    config: Config,
    *,
    seed: int = 0,
    behaviour: Behaviour | None = None,
) -> list[Episode]:
    """One scripted episode per question, deterministic for ``seed``."""
    rng = random.Random(seed)
    behaviour = behaviour or Behaviour()
    guesser = _Guesser(world)
    return [
        await script_episode(q, world, protocol, search, config, rng, behaviour, guesser)
        for q in questions
    ]
