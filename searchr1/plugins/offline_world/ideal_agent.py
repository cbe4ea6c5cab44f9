"""The offline world's ceiling: a scripted ideal agent evaluated through the same eval.

:class:`IdealAgent` is a :class:`~searchr1.core.types.Sampler` that needs no model. For
each question of the generated world it searches the right entity at each hop (the world
records the chain, :attr:`searchr1.plugins.offline_world.generate.WorldQuestion.hops`) and
answers what it read. It only uses what the search returned, like a perfect reader would.
"""

from __future__ import annotations

from typing import Any

from searchr1.sdk import UNKNOWN, ScriptedSampler, normalize_answer


class IdealAgent(ScriptedSampler):
    """A scripted sampler over the world's questions (no trainer comes with it)."""

    role = "the ideal agent"
    plays = "in the offline world (it only plays builtin:world questions)"

    def next_turn(self, prompt_text: str) -> str:
        """The ideal next assistant turn after ``prompt_text`` (prompt, turns, results)."""
        question, read = self._locate(prompt_text)
        searched = 0
        for hop in question.hops:
            if self.protocol.assistant_turn_text(query=hop) not in read:
                break
            searched += 1
        results = read
        for hop in question.hops[:searched]:
            # What the search returned after each query: the text after the query's turn.
            results = results.split(self.protocol.assistant_turn_text(query=hop), 1)[-1]
        if searched < len(question.hops):
            hop = question.hops[searched]
            if searched == 0 or normalize_answer(hop) in normalize_answer(read):
                return self.protocol.assistant_turn_text(query=hop)
            return self.protocol.assistant_turn_text(answer=UNKNOWN)
        found = normalize_answer(question.answer) in normalize_answer(results)
        return self.protocol.assistant_turn_text(answer=question.answer if found else UNKNOWN)


def ideal_agent_for(config: Any, tokenizer: Any, protocol: Any) -> IdealAgent | None:
    """The ideal agent when the agent protocol is ``tags`` (the one the offline world's
    tokenizer and warm start speak), else None. It plays every question of the world: through
    ``Asset.ceiling``, ``train`` evaluates it on the world's held-out set and the cold start
    imitates it on the world's training set."""
    if getattr(protocol, "name", None) != "tags":
        return None
    from searchr1.plugins.offline_world.generate import WORLD_SEED, generate_world

    world = generate_world(WORLD_SEED)
    return IdealAgent(tokenizer, protocol, [*world.train, *world.heldout])


class HardIdealAgent(ScriptedSampler):
    """The ideal agent of the harder world (:mod:`~searchr1.plugins.offline_world.hard_world`):
    it sends each of a question's ``hops`` in turn, a hop only once its words are in the
    question or what it read, and answers once every ``evidence`` text is in what the searches
    returned (the golden form found there, or the question's), else ``unknown``. A question
    without hops (the answer is in the question, or the archive every document cites) is
    answered at once, without a search."""

    role = "the ideal agent"
    plays = "in the harder offline world (it only plays builtin:world-hard questions)"

    def next_turn(self, prompt_text: str) -> str:
        question, read = self._locate(prompt_text)
        turn = self.protocol.assistant_turn_text
        hops = [hop for hop in question.hops if turn(query=hop) in read]
        if len(hops) < len(question.hops):
            hop = question.hops[len(hops)]
            known = set(normalize_answer(f"{question.question} {read}").split())
            reachable = set(normalize_answer(hop).split()) <= known
            return turn(query=hop) if reachable else turn(answer=UNKNOWN)
        if question.hops:
            seen = normalize_answer(read.split(turn(query=question.hops[0]), 1)[1])
        else:
            seen = normalize_answer(question.question)
        if not all(normalize_answer(text) in seen for text in question.evidence):
            return turn(answer=UNKNOWN)
        found = [a for a in question.golden_answers if normalize_answer(a) in seen]
        return turn(answer=max(found, key=len) if found else question.golden_answers[0])


def hard_ideal_agent_for(config: Any, tokenizer: Any, protocol: Any) -> HardIdealAgent | None:
    """``builtin:world-hard``'s ceiling: :class:`HardIdealAgent` under the ``tags`` protocol,
    else None; it plays every question of that world (the cold start imitates it)."""
    if getattr(protocol, "name", None) != "tags":
        return None
    from searchr1.plugins.offline_world.hard_world import generate_hard_world

    world = generate_hard_world()
    return HardIdealAgent(tokenizer, protocol, [*world.train, *world.heldout])
