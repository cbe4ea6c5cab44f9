"""The offline world's ceiling: the scripted ideal agent through the real eval (BM25 over
the generated corpus, the shipped tiny tokenizer, the tags protocol)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from searchr1.core.config import load_config
from searchr1.core.data import load_questions
from searchr1.core.evaluation import evaluate
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.scripted import UNKNOWN
from searchr1.kit.tokenizers import load_tokenizer
from searchr1.plugins.offline_world.ideal_agent import ideal_agent_for

N = 40


def _ceiling(config_text: str | None, tmp_path: Path) -> dict:
    path = None
    if config_text is not None:
        path = tmp_path / "config.toml"
        path.write_text(config_text)
    config = load_config(str(path) if path else None, registry=load_registry())
    registry = load_registry()
    tokenizer = load_tokenizer(config.model.base_model, config.assets, "model.base_model")
    protocol = make_protocol(config, tokenizer, load_registry())
    agent = ideal_agent_for(config, tokenizer, protocol)
    assert agent is not None
    questions = list(
        load_questions(config.data.eval, config.assets, field_name="data.eval").questions
    )[:N]
    search = registry.create("search_provider", config.search.provider, config)
    reward = registry.create("reward", config.reward.name, config)

    async def run():
        try:
            return await evaluate(agent, search, protocol, reward, questions, config)
        finally:
            await search.aclose()

    result = asyncio.run(run())
    return {"metrics": result.metrics, "records": result.records}


def _offline_text() -> str:
    from importlib.resources import files

    return files("searchr1.defaults").joinpath("offline.toml").read_text()


def test_ideal_agent_reaches_every_answer_the_demo_search_returns(tmp_path: Path) -> None:
    out = _ceiling(None, tmp_path)
    m = out["metrics"]
    assert m["n"] == N and m["em"] == 1.0 and m["format_rate"] == 1.0
    per = m["per_source"]
    # one search per hop: the two-hop questions take two
    assert per["world_1hop"]["search_calls_mean"] == 1.0
    assert per["world_2hop"]["search_calls_mean"] == 2.0


def test_ideal_agent_only_knows_what_it_read(tmp_path: Path) -> None:
    """With observations cut to 20 tokens some answers fall outside what the agent sees: the
    ceiling drops, and every miss answers "unknown" (it never uses the golden answer it was
    not shown)."""
    text = _offline_text().replace("max_observation_tokens = 96", "max_observation_tokens = 20")
    out = _ceiling(text, tmp_path)
    assert 0.5 < out["metrics"]["em"] < 1.0
    misses = [r for r in out["records"] if not r.em]
    assert misses and all(r.trajectory["final_answer"] == UNKNOWN for r in misses)


def test_ideal_agent_is_only_for_the_offline_world_with_tags(tmp_path: Path) -> None:
    # Which files it plays is the asset cache's choice (builtin:world/... only, see
    # test_plugins.py::test_the_offline_world_offers_its_ceiling_only_for_its_own_eval_set).
    tags, tool_calls = SimpleNamespace(name="tags"), SimpleNamespace(name="tool_calls")
    assert ideal_agent_for(load_config(None, registry=load_registry()), None, tool_calls) is None
    agent = ideal_agent_for(load_config(None, registry=load_registry()), None, tags)
    assert agent is not None
    with pytest.raises(ValueError, match="not in the offline world"):
        agent.next_turn("Question: who wrote Hamlet?")
