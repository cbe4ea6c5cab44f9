"""A fixed sampling seed gives each request its own seed, the same on every run."""

from __future__ import annotations

import asyncio
import dataclasses

from fakes import FakeSearch, ScriptedModel, tiny_tokenizer

from searchr1.core.config_schema import Config
from searchr1.core.types import Question
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.rl.rollout import rollout_questions, sampling_params

Q = Question(id="q1", question="Who wrote the old book?", golden_answers=("Alice",))
# scripts of one group must start differently (the fake matches later calls by first turn)
SCRIPTS = [[f"<search> old book {i} </search>", "<answer> Alice </answer>"] for i in range(3)]


def _seeds(seed: int | None) -> list[int | None]:
    tok = tiny_tokenizer()
    protocol = TagsProtocol(tok)
    model = ScriptedModel(tok, SCRIPTS)
    cfg = Config().replace(model={"max_new_tokens": 32})
    params = dataclasses.replace(sampling_params(cfg, protocol), seed=seed)
    asyncio.run(
        rollout_questions(model, FakeSearch(), protocol, [Q], cfg, group_size=3, sampling=params)
    )
    return [call.params.seed for call in model.calls]


def test_each_request_gets_its_own_reproducible_seed() -> None:
    seeds = _seeds(7)
    assert len(seeds) == 4  # one group call, then one call per trajectory
    assert len(set(seeds)) == 4 and None not in seeds
    assert sorted(seeds) == sorted(_seeds(7))
    assert set(seeds).isdisjoint(_seeds(8))


def test_no_seed_stays_unseeded() -> None:
    assert set(_seeds(None)) == {None}
