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
