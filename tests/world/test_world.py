"""The offline world: deterministic, held-out entities unseen in training, every answer
findable by the ``local`` search provider, warm-start transcripts the protocol parses (the
warm-start factory lives in ``scripts/warm_start/``), and the shipped example config equal to
the embedded default."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from warm_start.scripted_agent import Episode, script_episodes
from warm_start.tiny_base import MODEL_SIZES, tokenizer_texts

from searchr1.core.config import default_config_text, load_config
from searchr1.core.data import load_questions
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.plugins.local_search import LocalBM25Search
from searchr1.plugins.offline_world.generate import (
    ONE_HOP,
    TWO_HOP,
    World,
    generate_world,
    write_world,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(0)


@pytest.fixture(scope="module")
def world_dir(world: World, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("world")
    write_world(folder, world)
    return folder


@pytest.fixture(scope="module")
def config(world_dir: Path):
    """The embedded default, with the corpus pointed at this test's copy of the world."""
    text = default_config_text().replace(
        "builtin:world/corpus.jsonl", str(world_dir / "corpus.jsonl")
    )
    path = world_dir / "offline.toml"
    path.write_text(text)
    return load_config(path, env={}, registry=load_registry())


def test_same_seed_same_files_other_seed_other_world(world: World, world_dir: Path, tmp_path):
    write_world(tmp_path, generate_world(0))
    for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (world_dir / name).read_bytes(), name
    other = generate_world(1)
    assert [d["contents"] for d in other.documents()] != [d["contents"] for d in world.documents()]


def test_thousands_of_uniquely_named_entities(world: World):
    names = [e.name for e in world.entities.values()]
    assert len(names) >= 5000
    assert len(set(names)) == len(names)
    assert len(world.documents()) == len(names)


def test_heldout_entities_never_appear_in_training_questions(world: World):
    train_mentions = set().union(*(q.mentions for q in world.train))
    heldout_subjects = {q.subject for q in world.heldout}
    assert not heldout_subjects & train_mentions
    # Also as text: no held-out subject's name occurs in any training question or answer.
    names = {world.entities[s].name for s in heldout_subjects}
    train_words = set(re.findall(r"\w+", " ".join(f"{q.question} {q.answer}" for q in world.train)))
    assert not [n for n in names if set(n.split()) <= train_words]


def test_question_files_layout_and_sizes(world_dir: Path):
    heldout = load_questions(str(world_dir / "heldout.jsonl"), {})
    train = load_questions(str(world_dir / "train.jsonl"), {})
    assert not heldout.malformed and not train.malformed
    assert len(heldout.questions) >= 300
    assert set(heldout.per_source()) == {ONE_HOP, TWO_HOP}
    assert set(train.per_source()) == {ONE_HOP, TWO_HOP}
    assert heldout.per_source()[TWO_HOP] >= 100
    row = json.loads((world_dir / "corpus.jsonl").read_text().splitlines()[0])
    assert set(row) == {"id", "contents"}
    title, _, text = row["contents"].partition("\n")
    assert title.startswith('"') and title.endswith('"') and text


def test_every_golden_answer_is_found_by_following_the_hops(world: World, config):
    """An ideal agent (search each hop's name, read the first result) finds every answer with
    the demo's own search provider and ``top_k``; two-hop answers are not in the first hop's
    results, so two searches are really needed."""
    search = LocalBM25Search.from_config(config)
    top_k = config.search.top_k

    async def check() -> list[str]:
        problems = []
        for q in (*world.train, *world.heldout):
            texts = []
            for hop in q.hops:
                response = await search.search(hop, top_k)
                assert response.ok, response.error
                if not response.results or response.results[0].title != hop:
                    problems.append(f"{q.id}: search {hop!r} -> not first")
                texts.append(response.results[0].text if response.results else "")
            if q.answer not in texts[-1]:
                problems.append(f"{q.id}: answer {q.answer!r} not in {texts[-1]!r}")
            if len(q.hops) == 2 and q.answer in texts[0]:
                problems.append(f"{q.id}: two-hop answer already in the first hop")
        await search.aclose()
        return problems

    problems = asyncio.run(check())
    assert not problems, problems[:5]


@pytest.fixture(scope="module")
def protocol(world: World, config, tmp_path_factory: pytest.TempPathFactory):
    from searchr1.core.protocols import protocol_class
    from searchr1.plugins.offline_world.tiny_model import build_tokenizer

    texts = tokenizer_texts(world, protocol_class(config.rollout.protocol, load_registry()))
    tokenizer = build_tokenizer(texts, MODEL_SIZES["vocab_size"])
    return make_protocol(config, tokenizer, load_registry())


@pytest.fixture(scope="module")
def episodes(world: World, config, protocol) -> list[Episode]:
    search = LocalBM25Search.from_config(config)
    questions = random.Random(0).sample(world.train, 600)

    async def run() -> list[Episode]:
        try:
            return await script_episodes(world, questions, protocol, search, config)
        finally:
            await search.aclose()

    return asyncio.run(run())


def _segments(mask: list[bool]) -> list[tuple[int, int]]:
    """(start, end) of each run of True."""
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_warm_start_transcripts_parse_with_the_protocol(episodes, protocol, world: World):
    from searchr1.core.types import Question

    for ep in episodes:
        q = ep.question
        prompt = protocol.initial_prompt_tokens(Question(q.id, q.question, (q.answer,)))
        assert ep.tokens[: len(prompt)] == prompt
        assert not any(ep.train_mask[: len(prompt)])
        segments = _segments(ep.train_mask)
        assert len(segments) == len(ep.turns)
        for (start, end), turn in zip(segments, ep.turns, strict=True):
            action = protocol.parse_action(protocol.decode(ep.tokens[start:end]))
            if turn.query is not None:
                assert (action.kind, action.query) == ("search", turn.query)
            else:
                assert (action.kind, action.answer) == ("answer", turn.answer)
        assert ep.turns[-1].answer is not None  # every episode ends with an answer
        assert ep.train_mask[-1]
        observations = _segments(ep.observation_mask)
        assert len(observations) == sum(t.query is not None for t in ep.turns)
        for start, end in observations:
            text = protocol.decode(ep.tokens[start:end])
            assert text.strip().startswith("<information>") and "</information>" in text


@pytest.mark.parametrize(
    ("template", "call"), [("qwen3", '{"name": "search"'), ("qwen3_5", "<function=search>")]
)
def test_warm_start_turns_use_the_call_format_the_protocol_parses(
    world: World, config, template, call
):
    """Under ``tool_calls`` the scripted agent writes calls the way the model's own template
    does (Qwen3 JSON, Qwen3.5 XML with its think prefill), and they parse back."""
    from fakes import template_tokenizer

    from searchr1.kit.protocols.tool_calls import ToolCallsProtocol

    tools = ToolCallsProtocol(template_tokenizer(template), enable_thinking=True)
    search = LocalBM25Search.from_config(config)
    questions = random.Random(1).sample(world.train, 30)

    async def run() -> list[Episode]:
        try:
            return await script_episodes(world, questions, tools, search, config)
        finally:
            await search.aclose()

    calls = 0
    for ep in asyncio.run(run()):
        for (start, end), turn in zip(_segments(ep.train_mask), ep.turns, strict=True):
            text = tools.decode(ep.tokens[start:end])
            action = tools.parse_action(text)
            if turn.query is not None:
                calls += 1
                assert call in text and (action.kind, action.query) == ("search", turn.query)
            else:
                assert (action.kind, action.answer) == ("answer", turn.answer)
    assert calls > 0


def test_warm_start_acts_like_an_untrained_agent(episodes):
    """Searches only some of the time, sometimes with a vague query, sometimes answers
    right; the RL run has something to learn."""
    searched = [ep for ep in episodes if ep.turns[0].query is not None]
    rate = len(searched) / len(episodes)
    assert 0.3 <= rate <= 0.6, rate
    vague = [ep for ep in searched if ep.turns[0].query != ep.question.hops[0]]
    assert 0.15 <= len(vague) / len(searched) <= 0.45
    correct = Counter(ep.turns[-1].answer == ep.question.answer for ep in episodes)
    share = correct[True] / len(episodes)
    assert 0.1 <= share <= 0.5, share
    two_hop = [ep for ep in searched if len(ep.question.hops) == 2]
    assert any(sum(t.query is not None for t in ep.turns) == 2 for ep in two_hop)


def test_builtin_world_asset_builds_into_the_cache(tmp_path, monkeypatch, world_dir: Path):
    """Built once; a cached file damaged later (cut short) is found by the next process that
    uses the asset, which discards the folder and builds it again, with a warning."""
    from structlog.testing import capture_logs

    from searchr1.core import assets
    from searchr1.core.assets import resolve

    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path))
    known = load_registry().assets
    path = Path(resolve("builtin:world/heldout.jsonl", known))
    assert path.read_bytes() == (world_dir / "heldout.jsonl").read_bytes()
    assert Path(resolve("builtin:world/corpus.jsonl", known)).is_file()

    with path.open("r+b") as fh:
        fh.truncate(100)
    monkeypatch.setattr(assets, "_whole", set())  # what a new process knows
    with capture_logs() as logs:
        assert Path(resolve("builtin:world/heldout.jsonl", known)) == path
    (warning,) = [e for e in logs if e["event"] == "cache_damaged"]
    assert warning["log_level"] == "warning" and f"{path} is truncated" in warning["problem"]
    assert path.read_bytes() == (world_dir / "heldout.jsonl").read_bytes()


#: a process that builds an asset whose build waits for a file (``release``) to appear and
#: notes each build it starts in ``builds``
_SLOW_BUILD = """
import sys, time
from pathlib import Path
from searchr1.sdk import Asset, ensure_built

folder, work = Path(sys.argv[1]), Path(sys.argv[2])

def build(tmp):
    with (work / "builds").open("a") as f:
        f.write("build\\n")
    while not (work / "release").exists():
        time.sleep(0.05)
    (tmp / "data.txt").write_text("built")

ensure_built(folder, Asset("1", build, takes="as long as the test holds it"), "builtin:slow")
print((folder / "data.txt").read_text())
"""


def test_a_process_that_needs_an_asset_being_built_waits_for_that_build(tmp_path: Path) -> None:
    """Two processes need the same asset at once (two test workers, two commands): the second
    says it waits for the first, which builds it once, and then uses that build."""
    import subprocess
    import sys
    import time

    folder = tmp_path / "cache" / "slow-1"

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _SLOW_BUILD, str(folder), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = start()
    deadline = time.monotonic() + 120
    while not (tmp_path / "builds").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = start()
    assert second.stderr is not None
    waiting = second.stderr.readline()  # blocks until the second process says why it waits
    assert waiting.startswith("searchr1: waiting for another process to finish building "), waiting
    (tmp_path / "release").touch()
    outs = [proc.communicate(timeout=120) for proc in (first, second)]
    assert [proc.returncode for proc in (first, second)] == [0, 0], outs
    assert [out.splitlines()[-1] for out, _ in outs] == ["built", "built"]
    assert (tmp_path / "builds").read_text() == "build\n"  # built once
    assert "searchr1: building builtin:slow (first use: " in outs[0][1]
    assert "building builtin:slow" not in outs[1][1]


def test_example_config_equals_the_embedded_default():
    example = (ROOT / "examples" / "offline.toml").read_text("utf-8")
    assert example == default_config_text()
    cfg = load_config(ROOT / "examples" / "offline.toml", env={}, registry=load_registry())
    assert cfg.model.base_model == "builtin:tiny"
    assert cfg.search.provider == "local"
    assert cfg.plugin_table("search", "local")["corpus"] == "builtin:world/corpus.jsonl"
    assert cfg.data.train == "builtin:world/train.jsonl"
    assert cfg.data.eval == "builtin:world/heldout.jsonl"


def test_builtin_tiny_is_the_shipped_warm_start_and_loads(tmp_path, monkeypatch, world: World):
    """``builtin:tiny`` copies the shipped weights (no fine-tune at first run) and loads with
    ``from_pretrained``; its tokenizer spells world names in a few tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1.core.assets import resolve
    from searchr1.plugins.offline_world.assets import SHIPPED_WARM_START

    rebuild = "run python scripts/build_warm_start.py --shipped"
    assert (SHIPPED_WARM_START / "config.json").is_file(), rebuild
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path))
    path = resolve("builtin:tiny", load_registry().assets)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    sizes = [len(tokenizer.encode(" " + q.hops[0])) for q in world.heldout]
    assert max(sizes) <= 8 and sum(sizes) / len(sizes) <= 5


def test_builtin_tiny_without_its_shipped_weights_says_how_to_mend_the_install(
    tmp_path, monkeypatch
):
    """An installation missing the shipped weights fails with a message naming the missing
    file and the two fixes (reinstall, or the recipe script), not by fine-tuning at run time."""
    from searchr1.core.assets import resolve
    from searchr1.core.errors import SearchR1Error
    from searchr1.plugins.offline_world import assets

    monkeypatch.setattr(assets, "SHIPPED_WARM_START", tmp_path / "warm_start")
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SearchR1Error) as caught:
        resolve("builtin:tiny", load_registry().assets)
    message = str(caught.value)
    assert str(tmp_path / "warm_start" / "config.json") in message
    assert "reinstall searchr1" in message and "scripts/build_warm_start.py --shipped" in message
    assert not (tmp_path / "cache" / "tiny-2").exists()  # nothing half-built is cached
