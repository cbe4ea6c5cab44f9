"""The search-behaviour reward terms (``retrieval_credit``, ``search_cost``,
``answer_length_penalty``) on trajectories the rollout made (a scripted model, an in-memory
search), their settings' checks, dynamic sampling on a reward component, and the three
composed as ``[reward] terms`` training the demo for 2 steps, components in the metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import tomli_w
from cli_run import make_config, read_events
from fakes import FakeSearch, ScriptedModel, tiny_tokenizer

from searchr1.core.config import parse_config
from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError, ConfigValueError
from searchr1.core.plugins import load_registry
from searchr1.core.rewards import create_reward
from searchr1.core.types import (
    Question,
    ScoredGroup,
    SearchResponse,
    SearchResult,
    Trajectory,
)
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.rl.advantages import is_degenerate
from searchr1.rl.rollout import rollout_questions
from searchr1.rl.step import kept_groups

GOLDEN = ("Antoine de Saint-Exupéry", "Saint-Exupéry")
TERMS = ("retrieval_credit", "search_cost", "answer_length_penalty")


def config_of(doc: dict) -> Config:
    return parse_config(tomli_w.dumps(doc), source="c.toml", env={}, registry=load_registry())


def term(name: str, **settings: object):
    config = config_of({"reward": {name: settings}}) if settings else Config()
    return load_registry().create("reward", name, config)


def rollouts(*scripts: list[dict[str, str] | str]) -> list[Trajectory]:
    """One group, a trajectory per script (turns given as ``{"query": ...}`` or
        ``{"answer": ...}``, or as the text itself); the search answers ``little prince`` with the author's name,
        ``weather`` with nothing useful and ``broken`` with an error (any other query: a passage
    about it). The scripts of a group must start with different turns (:class:`ScriptedModel`)."""
    tok = tiny_tokenizer()
    protocol = TagsProtocol(tok)
    search = FakeSearch(
        responses={
            "little prince": SearchResponse(
                (SearchResult("The Little Prince", "Written by ANTOINE de Saint-Exupéry, 1943."),)
            ),
            "weather": SearchResponse((SearchResult("Weather", "Rain over Lyon today."),)),
            "broken": SearchResponse(error="timeout"),
        }
    )
    texts = [
        [t if isinstance(t, str) else protocol.assistant_turn_text(**t) for t in s] for s in scripts
    ]
    model = ScriptedModel(tok, texts)
    q = Question("q", "Who wrote The Little Prince?", GOLDEN)
    config = config_of({"rollout": {"max_search_calls": 3, "max_assistant_turns": 4}})
    (group,) = asyncio.run(
        rollout_questions(model, search, protocol, [q], config, group_size=len(scripts))
    )
    return group


def test_retrieval_credit_credits_a_retrieved_golden_answer_normalised_as_em() -> None:
    found, missed, failed, none = rollouts(
        [{"query": "weather"}, {"query": "little prince"}, {"answer": "Lyon"}],
        [{"query": "lyon"}, {"answer": "Antoine de Saint-Exupéry"}],
        [{"query": "broken"}, {"answer": "Saint-Exupéry"}],
        [{"answer": "Saint-Exupéry"}],
    )
    credit = term("retrieval_credit", credit=0.25)
    got = [credit(t, GOLDEN) for t in (found, missed, failed, none)]
    # case and punctuation differ in the passage: normalised like exact match, it is a hit,
    # though the answer given is wrong (process credit)
    assert got[0].reward == 0.25 and got[0].components == {"hit": 1.0, "hit_rate": 0.5}
    # the right answer without retrieving it, a failed search, no search: no credit
    for r in got[1:]:
        assert r.reward == 0.0 and r.components["hit"] == 0.0
    assert got[3].components["hit_rate"] == 0.0


def test_a_golden_answer_must_occur_as_whole_words() -> None:
    from searchr1.plugins.rewards.search_terms import contains_answer

    assert contains_answer("Written by Saint-Exupéry.", ["saint exupery"]) is False
    assert contains_answer("Paris, France", ["Paris"]) is True
    assert contains_answer("Parisian streets", ["Paris"]) is False
    assert contains_answer("anything", [""]) is False


def test_search_cost_prices_every_call_past_the_free_ones() -> None:
    three, one, zero = rollouts(
        [{"query": "weather"}, {"query": "broken"}, {"query": "little prince"}, {"answer": "x"}],
        [{"query": "little prince"}, {"answer": "Saint-Exupéry"}],
        [{"answer": "Saint-Exupéry"}],
    )
    cost = term("search_cost", cost_per_search=0.1, free_searches=1)
    got = [cost(t, GOLDEN) for t in (three, one, zero)]
    assert [r.reward for r in got] == [pytest.approx(-0.2), 0.0, 0.0]
    assert [r.components["searches"] for r in got] == [3.0, 1.0, 0.0]  # a failed one counts
    assert [r.components["charged"] for r in got] == [2.0, 0.0, 0.0]
    assert term("search_cost")(three, GOLDEN).reward == pytest.approx(-0.15)  # the default 0.05
    gated = term("search_cost", cost_per_search=0.1, only_when_correct=True)
    # the wrong answer "x" after three searches is not charged; the right one after one is
    assert [gated(t, GOLDEN).reward for t in (three, one, zero)] == [0.0, pytest.approx(-0.1), 0.0]
    assert gated(three, GOLDEN).components == {"searches": 3.0, "charged": 0.0}


def test_answer_length_penalty_prices_padding_past_the_margin() -> None:
    exact, padded, long_pad, unanswered = rollouts(
        [{"answer": "Antoine de Saint-Exupéry"}],
        # 4 tokens of golden answer ("antoine de saintexupéry" is 3) + 4 extra
        [{"answer": "Antoine de Saint-Exupéry, the French writer and aviator"}],
        [{"answer": " ".join(["Saint-Exupéry"] + ["word"] * 40)}],
        ["I do not know."],
    )
    penalty = term("answer_length_penalty", margin=2, per_token=0.1, max_penalty=0.5)
    got = {name: penalty(t, GOLDEN) for name, t in locals().items() if isinstance(t, Trajectory)}
    assert got["exact"].reward == 0.0 and got["exact"].components["excess_tokens"] == 0.0
    # normalised: "antoine de saintexupéry french writer and aviator" = 7 tokens ("the" and
    # the comma gone), the longest golden answer 3, margin 2: 2 tokens too many
    assert got["padded"].components == {"answer_tokens": 7.0, "excess_tokens": 2.0}
    assert got["padded"].reward == pytest.approx(-0.2)
    assert got["long_pad"].reward == pytest.approx(-0.5)  # max_penalty bounds it
    assert got["unanswered"].reward == 0.0  # no answer: the format rule's business
    unbounded = term("answer_length_penalty", margin=2, per_token=0.1, max_penalty=0.0)
    assert unbounded(long_pad, GOLDEN).reward == pytest.approx(-0.1 * (41 - 3 - 2))


def test_composed_terms_log_their_components() -> None:
    config = config_of(
        {"reward": {"name": "format_answer", "terms": list(TERMS), "weights": {"search_cost": 2.0}}}
    )
    reward = create_reward(config, load_registry())
    (t,) = rollouts([{"query": "little prince"}, {"answer": "Antoine de Saint-Exupéry"}])
    r = reward(t, GOLDEN)
    assert r.reward == pytest.approx(1.0 + 0.1 + 2.0 * -0.05 + 0.0)
    assert r.components["retrieval_credit/hit"] == 1.0
    assert r.components["search_cost/searches"] == 1.0
    assert r.components["answer_length_penalty/excess_tokens"] == 0.0
    assert {"retrieval_credit", "search_cost", "answer_length_penalty"} <= set(r.components)


def test_dynamic_sampling_on_correct_replaces_a_group_only_the_price_separates() -> None:
    """All right, one with a search more (rewards differ by the price only); one right and
    one wrong; all wrong. On the reward both of the first two are informative; on
    ``correct`` only the second is, and the first is kept only to fill the step."""
    price = {"terms": ["search_cost"], "search_cost": {"only_when_correct": True}}
    reward = create_reward(config_of({"reward": price}), load_registry())
    right = {"answer": "Saint-Exupéry"}
    scripts = (
        ([{"query": "little prince"}, right], [{"query": "weather"}, {"query": "little prince"}, right]),
        ([{"query": "little prince"}, right], [{"query": "weather"}, {"answer": "Lyon"}]),
        ([{"query": "weather"}, {"answer": "Lyon"}], [{"answer": "Paris"}]),
    )  # fmt: skip
    groups = []
    for script in scripts:
        trajectories = rollouts(*script)
        rewards = [reward(t, GOLDEN) for t in trajectories]
        degenerate = is_degenerate([r.reward for r in rewards])
        groups.append(
            ScoredGroup(Question("q", "?", GOLDEN), trajectories, rewards, (0.0, 0.0), degenerate)
        )
    assert [g.degenerate for g in groups] == [False, False, True]
    assert kept_groups(groups, 2, "reward", keep_degenerate=False) == [0, 1]
    assert kept_groups(groups, 1, "correct", keep_degenerate=False) == [1]
    assert kept_groups(groups, 2, "correct", keep_degenerate=False) == [1, 0]
    assert kept_groups(groups, 1, "correct", keep_degenerate=True) == [1, 0, 2]
    with pytest.raises(
        ConfigValueError, match=r"rollout.dynamic_sampling_metric = 'acc'.*'correct'"
    ):
        kept_groups(groups, 2, "acc", keep_degenerate=False)


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("retrieval_credit", {"credit": -1.0}, "reward.retrieval_credit.credit"),
        ("search_cost", {"cost_per_search": -0.1}, "reward.search_cost.cost_per_search"),
        ("search_cost", {"free_searches": 1.5}, "reward.search_cost.free_searches"),
        ("answer_length_penalty", {"margn": 2}, "did you mean 'margin'"),
        ("answer_length_penalty", {"max_penalty": -1}, "reward.answer_length_penalty"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(name, settings, message) -> None:
    with pytest.raises(ConfigError, match=message):
        term(name, **settings)


def test_the_three_terms_train_the_demo_for_two_steps(tmp_path: Path, config_file, run_cli):
    rollout = {"questions_per_batch": 2, "group_size": 3, "dynamic_sampling": True}
    text = make_config(
        {"rollout": rollout | {"dynamic_sampling_metric": "correct", "max_extra_draws": 2}},
        reward={"name": "format_answer", "terms": list(TERMS)},
    )
    run = tmp_path / "run"
    result = run_cli("train", "--config", config_file(text), "--run-dir", run)
    assert result.code == 0, result.out + result.err
    steps = read_events(run, "metrics")
    assert len(steps) == 2
    components = {
        "retrieval_credit/hit", "retrieval_credit/hit_rate", "search_cost/searches",
        "search_cost/charged", "answer_length_penalty/answer_tokens",
        "answer_length_penalty/excess_tokens",
    }  # fmt: skip
    for m in steps:
        assert {f"reward/{c}" for c in (*TERMS, *components)} <= set(m)
        # the step's mean search cost is the default price times its mean searches
        assert m["reward/search_cost"] == pytest.approx(-0.05 * m["searches_per_trajectory"])
    dumped = [json.loads(line) for p in (run / "trajectories").glob("*.jsonl") for line in p.open()]
    for t in dumped:  # the reward is the sum of the base and the three terms
        c = t["components"]
        base = (1.0 if c["correct"] else 0.0) if c["format"] else -0.1
        assert t["reward"] == pytest.approx(base + sum(c[name] for name in TERMS))
