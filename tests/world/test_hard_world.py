"""The harder offline world (``builtin:world-hard``): deterministic, every question type
present and built as its type says (chains, comparisons, same-name distractors, two documents
of one person, aliases, questions that need no search), held-out entities unseen in
training, and its ideal agent reaching >= 95% of every type through the real eval (BM25 over
the generated corpus, the tags protocol, ``examples/real-model-hard.toml``'s limits)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from searchr1.core.config import load_config
from searchr1.core.data import load_questions
from searchr1.core.evaluation import evaluate
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.scripted import UNKNOWN
from searchr1.kit.tokenizers import load_tokenizer
from searchr1.plugins.local_search import LocalBM25Search
from searchr1.plugins.offline_world.hard_world import (
    ALIAS,
    COLD_START_SOURCES,
    COMPARE,
    DISTRACTOR,
    NO_SEARCH,
    SOURCES,
    THREE_HOP,
    TWO_DOC,
    HardWorld,
    generate_hard_world,
    write_hard_world,
)
from searchr1.plugins.offline_world.ideal_agent import HardIdealAgent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world() -> HardWorld:
    return generate_hard_world()


@pytest.fixture(scope="module")
def world_dir(world: HardWorld, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("world-hard")
    write_hard_world(folder, world)
    return folder


@pytest.fixture(scope="module")
def config(world_dir: Path):
    """The hard example, its corpus and eval pointed at this test's copy of the world and its
    model at the shipped tiny one (the ideal agent needs a tokenizer, not SmolLM2's weights)."""
    text = (ROOT / "examples" / "real-model-hard.toml").read_text()
    text = text.replace("builtin:world-hard/", f"{world_dir}/")
    text = text.replace("builtin:smollm2-135m-instruct", "builtin:tiny")
    path = world_dir / "hard.toml"
    path.write_text(text)
    return load_config(path, env={}, registry=load_registry())


def _by_source(questions) -> dict[str, list]:
    out: dict[str, list] = {}
    for q in questions:
        out.setdefault(q.data_source, []).append(q)
    return out


def _texts(world: HardWorld) -> dict[str, list[str]]:
    """Each title's document texts."""
    out: dict[str, list[str]] = {}
    for row in world.documents():
        title, text = row["contents"].split("\n", 1)
        out.setdefault(title.strip('"'), []).append(text)
    return out


def test_same_seed_same_files_other_seed_other_world(world: HardWorld, world_dir, tmp_path):
    write_hard_world(tmp_path, generate_hard_world())
    for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl", "cold_start.jsonl"):
        assert (tmp_path / name).read_bytes() == (world_dir / name).read_bytes(), name
    assert generate_hard_world(1).documents() != world.documents()


def test_every_type_is_its_own_source_in_both_splits(world: HardWorld) -> None:
    held = Counter(q.data_source for q in world.heldout)
    assert held == {source: 40 for source in SOURCES}
    train = Counter(q.data_source for q in world.train)
    assert set(train) == set(SOURCES) and min(train.values()) >= 100
    # hops per chain type; a comparison searches both of its entities
    for q in world.heldout:
        want = {"hard_1hop": 1, "hard_2hop": 2, THREE_HOP: 3, COMPARE: 2, NO_SEARCH: 0}
        if q.data_source in want:
            assert len(q.hops) == want[q.data_source], q
    assert len({q.qid for q in world.train + world.heldout}) == len(world.train + world.heldout)


def test_heldout_entities_never_appear_in_a_training_question(world: HardWorld) -> None:
    held_about = set().union(*(q.about for q in world.heldout))
    assert held_about <= world.reserved
    for q in world.train:
        assert not q.mentions & world.reserved, q
    # and by name, in the text a model reads: no training question or answer names one
    names = {t for t in _texts(world)}
    id_names = {d.id.removesuffix("-career"): d.title for d in world.docs}
    held_names = {id_names[i] for i in held_about} & names
    train_text = " ".join(f"{q.question} {' '.join(q.golden_answers)}" for q in world.train)
    assert held_names and not [n for n in held_names if n in train_text]


def test_aliases_golden_forms_and_documents_use_either(world: HardWorld) -> None:
    alias = _by_source(world.heldout + world.train)[ALIAS]
    assert all(len(q.golden_answers) == 2 for q in alias)
    short, formal = zip(*(q.golden_answers for q in alias), strict=True)
    assert all(f.endswith(f"of {s}") for s, f in zip(short, formal, strict=True))
    uses_formal = [q for q in alias if q.golden_answers[1] in q.evidence[0]]
    uses_short = [q for q in alias if q.golden_answers[1] not in q.evidence[0]]
    assert uses_formal and uses_short  # the corpus says either form


def test_distractors_share_their_name_and_the_question_tells_them_apart(world: HardWorld):
    texts = _texts(world)
    for q in _by_source(world.heldout)[DISTRACTOR]:
        (query,) = q.hops
        name, job = query.rsplit(" ", 1)
        docs = texts[name]
        assert len(docs) == 2 and job in q.question
        right = [d for d in docs if f" {job}" in d]
        assert len(right) == 1 and q.evidence[0] in right[0]
        assert q.golden_answers[0] in right[0]


def test_a_search_for_a_distractors_name_returns_both(world: HardWorld, config) -> None:
    search = LocalBM25Search.from_config(config)
    try:
        q = _by_source(world.heldout)[DISTRACTOR][0]
        name = q.hops[0].rsplit(" ", 1)[0]
        response = asyncio.run(search.search(name, 3))
        assert [r.title for r in response.results[:2]] == [name, name]
    finally:
        asyncio.run(search.aclose())


def test_no_search_questions_hold_their_answer_or_ask_the_archive(world: HardWorld) -> None:
    texts = _texts(world)
    every = [t for docs in texts.values() for t in docs]
    kinds = Counter()
    for q in _by_source(world.heldout + world.train)[NO_SEARCH]:
        kinds[q.qtype] += 1
        (answer,) = q.golden_answers
        if q.qtype == "archive":
            assert answer == world.archive and all(answer in t for t in every)
        else:
            intro, ask = q.question.split(". ", 1)
            assert answer in intro and answer not in ask
            name = intro.split(",")[0]
            # the corpus does not know the stranger, but knows someone of a shared name word
            assert name not in texts and any(t.startswith(name.split()[0] + " ") for t in texts)
    assert set(kinds) == {"archive", "stated_city", "stated_year"}


def test_two_document_questions_need_both_documents_of_one_person(world: HardWorld) -> None:
    texts = _texts(world)
    for q in _by_source(world.heldout)[TWO_DOC]:
        (name,) = q.hops
        bio, career = q.evidence
        assert bio in texts[name][0] or bio in texts[name][1]
        assert career in " ".join(texts[name]) and q.golden_answers[0] in career
        assert q.golden_answers[0] not in bio
        # the career names two employers in two cities: the birth city picks one
        born_in = [c for c in career.replace(" and ", ", ").split() if c.istitle()]
        assert len(born_in) >= 4


def test_comparisons_answer_one_of_their_two_entities(world: HardWorld) -> None:
    for q in _by_source(world.heldout)[COMPARE]:
        a, b = q.hops
        assert q.golden_answers[0] in (a, b) and a in q.question and b in q.question


def test_the_cold_start_set_is_training_questions_of_its_sources(world: HardWorld, world_dir):
    cold = load_questions(str(world_dir / "cold_start.jsonl"), {}).questions
    train = {q.id for q in load_questions(str(world_dir / "train.jsonl"), {}).questions}
    assert {q.data_source for q in cold} == set(COLD_START_SOURCES)
    assert {q.id for q in cold} <= train


def test_the_ideal_agent_answers_every_type_through_the_real_eval(world: HardWorld, config):
    """>= 95% of every held-out type; no search for the no-search type, one per hop else."""
    tokenizer = load_tokenizer(config.model.base_model, config.assets, "model.base_model")
    registry = load_registry()
    protocol = make_protocol(config, tokenizer, registry)
    agent = HardIdealAgent(tokenizer, protocol, [*world.train, *world.heldout])
    questions = list(load_questions(config.data.eval, config.assets).questions)
    search = registry.create("search_provider", config.search.provider, config)
    reward = registry.create("reward", config.reward.name, config)

    async def run():
        try:
            return await evaluate(agent, search, protocol, reward, questions, config)
        finally:
            await search.aclose()

    result = asyncio.run(run())
    per = result.metrics["per_source"]
    assert set(per) == set(SOURCES)
    for source, m in per.items():
        assert m["em"] >= 0.95 and m["format_rate"] == 1.0, (source, m)
    assert per[NO_SEARCH]["search_calls_mean"] == 0.0
    assert per[THREE_HOP]["search_calls_mean"] == 3.0
    misses = [r for r in result.records if not r.em]
    assert all(r.trajectory["final_answer"] == UNKNOWN for r in misses)


def test_the_ideal_agent_answers_unknown_when_the_evidence_was_cut(world: HardWorld, config):
    """It never answers from what it was not shown: with observations cut to 12 tokens the
    chains fail (answer ``unknown``), the no-search questions do not."""
    import dataclasses

    cut = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, max_observation_tokens=12)
    )
    tokenizer = load_tokenizer(cut.model.base_model, cut.assets, "model.base_model")
    registry = load_registry()
    protocol = make_protocol(cut, tokenizer, registry)
    agent = HardIdealAgent(tokenizer, protocol, [*world.train, *world.heldout])
    by = _by_source(load_questions(cut.data.eval, cut.assets).questions)
    questions = by[THREE_HOP][:8] + by[NO_SEARCH][:8]
    search = registry.create("search_provider", cut.search.provider, cut)
    reward = registry.create("reward", cut.reward.name, cut)

    async def run():
        try:
            return await evaluate(agent, search, protocol, reward, questions, cut)
        finally:
            await search.aclose()

    per = asyncio.run(run()).metrics["per_source"]
    assert per[THREE_HOP]["em"] < 0.5 and per[NO_SEARCH]["em"] == 1.0
