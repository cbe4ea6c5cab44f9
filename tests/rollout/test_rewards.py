"""Rewards: the reference setup's table (1.0 / 0.0 / -0.1), components, and answer normalisation."""

from __future__ import annotations

import asyncio
import re
import string

import pytest
from fakes import FakeSearch, ScriptedModel, tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.answers import exact_match, f1_score, normalize_answer
from searchr1.core.config import parse_config
from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.types import Question, Trajectory, Turn
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.kit.protocols.tool_calls import ToolCallsProtocol
from searchr1.rl.rollout import rollout_questions

GOLDEN = ("Antoine de Saint-Exupéry",)
#: the protocol whose rule the rollout applies to a trajectory's turns (its ``format_ok``)
PROTOCOLS = {"tags": TagsProtocol, "tool_calls": ToolCallsProtocol}


def reward(name: str = "format_answer", config: Config | None = None):
    return load_registry().create("reward", name, config or Config())


def traj(protocol: str, texts: list[str], final: str | None) -> Trajectory:
    turns = tuple(Turn((), t, "answer" if final is not None else "invalid") for t in texts)
    return Trajectory(
        trajectory_id="t", question="q", golden_answers=GOLDEN, tokens=(), generated_mask=(),
        logprobs=(), prompt_len=0, turns=turns,
        end_reason="answered" if final is not None else "invalid_action",
        final_answer=final, final_text="".join(texts), search_calls=0, search_errors=0,
        format_ok=PROTOCOLS[protocol].answered_in_format(texts, final),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("protocol", "texts", "final", "expected", "fmt", "correct"),
    [
        ("tags", ["<answer> antoine de saint-exupery </answer>"], "antoine de saint-exupery", 0.0, 1, 0),
        ("tags", ["<answer> Antoine de Saint-Exupéry. </answer>"], "Antoine de Saint-Exupéry.", 1.0, 1, 1),
        ("tags", ["<search> a </search>", "<answer> Lyon </answer>"], "Lyon", 0.0, 1, 0),
        ("tags", ["I think it is Antoine de Saint-Exupéry"], None, -0.1, 0, 0),
        ("tags", ["<answer>  </answer>"], "", -0.1, 0, 0),
        ("tool_calls", ["Answer: Antoine de Saint-Exupéry"], "Antoine de Saint-Exupéry", 1.0, 1, 1),
        ("tool_calls", ["Answer: France"], "France", 0.0, 1, 0),
        # two Answer: lines across the trajectory: ambiguous, so a format error
        ("tool_calls", ["Answer: Paris\n<tool_call>{}</tool_call>", "Answer: Antoine de Saint-Exupéry"],
         "Antoine de Saint-Exupéry", -0.1, 0, 1),
        ("tool_calls", ["The author is Antoine de Saint-Exupéry."], None, -0.1, 0, 0),
    ],
)  # fmt: skip
def test_seed_reward_table(protocol, texts, final, expected, fmt, correct) -> None:
    result = reward()(traj(protocol, texts, final), GOLDEN)
    assert result.reward == pytest.approx(expected)
    assert (result.components["format"], result.components["correct"]) == (fmt, correct)


def test_format_and_answer_rewards_are_the_two_halves() -> None:
    wrong_format = traj("tool_calls", ["Answer: a\nAnswer: Antoine de Saint-Exupéry"], "a")
    right = traj("tool_calls", ["Answer: Antoine de Saint-Exupéry"], "Antoine de Saint-Exupéry")
    wrong = traj("tool_calls", ["Answer: Paris"], "Paris")
    assert [reward("format")(t, GOLDEN).reward for t in (wrong_format, right, wrong)] == [
        pytest.approx(-0.1), 0.0, 0.0]  # fmt: skip
    assert [reward("answer")(t, GOLDEN).reward for t in (wrong_format, right, wrong)] == [
        0.0, 1.0, 0.0]  # fmt: skip


def test_f1_is_reported_but_not_rewarded() -> None:
    result = reward()(traj("tags", ["<answer> Saint-Exupéry </answer>"], "Saint-Exupéry"), GOLDEN)
    assert result.reward == 0.0
    assert result.components["f1"] == pytest.approx(0.5)  # 1 of 3 golden tokens, precision 1


def test_reward_settings_come_from_the_reward_table() -> None:
    cfg = parse_config(
        '[reward]\nname = "format_answer"\n[reward.format_answer]\nformat_penalty = -0.5\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    assert reward(config=cfg)(traj("tags", ["no answer"], None), GOLDEN).reward == -0.5
    bad = parse_config(
        "[reward.format_answer]\nformat_penalti = -0.5\n",
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    with pytest.raises(ConfigError, match="did you mean 'format_penalty'"):
        reward(config=bad)


def test_rewards_score_rollout_trajectories_of_both_protocols() -> None:
    tok = tiny_tokenizer()
    q = Question("q", "Who wrote The Little Prince?", GOLDEN)
    for protocol in (TagsProtocol(tok), ToolCallsProtocol(tok)):
        scripts = [
            [protocol.assistant_turn_text(query="little prince"),
             protocol.assistant_turn_text(answer="Antoine de Saint-Exupéry")],
            [protocol.assistant_turn_text(answer="Lyon")],
            ["I do not know."],
        ]  # fmt: skip
        model = ScriptedModel(tok, scripts)
        (group,) = asyncio.run(
            rollout_questions(model, FakeSearch(), protocol, [q], Config(), group_size=3)
        )
        assert [reward()(t, GOLDEN).reward for t in group] == [1.0, 0.0, pytest.approx(-0.1)]


# ------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(
    ("prediction", "golden", "match"),
    [
        ("The Eiffel Tower.", "eiffel tower", True),
        ("  Paris,\n France ", "paris france", True),
        ("an apple", "Apple", True),
        ("Theatre", "atre", False),  # articles only as whole words
        ("Saint-Exupéry", "saintexupéry", True),  # punctuation is dropped, not spaced
        ("Saint-Exupéry", "Saint-Exupery", False),  # accents are kept
        ("ＰＡＲＩＳ", "paris", True),  # full-width letters fold (NFKC)
        ("北京。", "北京", True),  # CJK punctuation is punctuation too
        ("1,000", "1000", True),
        ("", "", False),  # an empty prediction never matches
        ("...", "!", False),
        (None, "x", False),
        # ASCII symbols are string.punctuation, removed as in Search-R1:
        ("$100", "100", True),
        ("C++", "C", True),
        ("<10", "10", True),
        ("a|b", "ab", True),
        ("x^2 = y~", "x2 y", True),
        ("＄１００", "100", True),  # full-width symbol and digits fold to ASCII first
        ("100 €", "100", False),  # non-ASCII symbols are kept (Search-R1 keeps them too)
    ],
)
def test_exact_match_normalisation(prediction, golden, match) -> None:
    assert exact_match(prediction, [golden]) is match


def _search_r1_normalize_answer(s: str) -> str:
    """A faithful reimplementation of Search-R1's ``normalize_answer``
    (``verl/utils/reward_score/qa_em.py``, itself SQuAD's): lower, remove
    ``string.punctuation``, articles to a space, collapse whitespace, in that order."""
    exclude = set(string.punctuation)
    s = s.lower()
    s = "".join(ch for ch in s if ch not in exclude)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


# Strings rich in what normalisation touches: symbols and punctuation (all of ASCII's),
# articles in every case and glued to other words, every ASCII whitespace character.
_PIECES = st.one_of(
    st.sampled_from(list(string.punctuation)),
    st.sampled_from(["a", "an", "the", "A", "An", "THE", "tHe", "anne", "theta", "ban"]),
    st.sampled_from([" ", "  ", "\t", "\n", "\r", "\x0b", "\x0c"]),
    st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=6),
)
_ASCII_TEXT = st.lists(_PIECES, max_size=25).map("".join)


@settings(max_examples=400, deadline=None)
@given(_ASCII_TEXT, st.text(alphabet=[chr(i) for i in range(128)], max_size=30))
def test_normalize_answer_is_search_r1s_on_ascii(rich: str, anything: str) -> None:
    for text in (rich, anything):
        assert normalize_answer(text) == _search_r1_normalize_answer(text)


@settings(max_examples=200, deadline=None)
@given(_ASCII_TEXT, _ASCII_TEXT)
def test_exact_match_agrees_with_search_r1_on_ascii(prediction: str, golden: str) -> None:
    pred, gold = _search_r1_normalize_answer(prediction), _search_r1_normalize_answer(golden)
    # The one documented difference: an answer that normalises to nothing never matches.
    assert exact_match(prediction, [golden]) is (pred == gold and pred != "")


def test_normalize_answer_and_extract() -> None:
    assert normalize_answer("  The  Little   Prince! ") == "little prince"
    assert TagsProtocol.extract_answers("<answer>a</answer><answer> b </answer>") == ["a", "b"]
    assert ToolCallsProtocol.extract_answers("x\nAnswer: y\n") == ["y"]
    assert f1_score("paris france", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("lyon", ["Paris", "Lyon"]) == 1.0 and f1_score(None, ["x"]) == 0.0
