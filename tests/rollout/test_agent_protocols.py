"""Agent protocols: prompt rendering, action parsing, observations and scripted turns."""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import FakeSearch, ScriptedModel, template_tokenizer, tiny_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.cli.smoke_verdict import reference_criteria
from searchr1.core.agent_protocol import Action
from searchr1.core.config_schema import Config
from searchr1.core.errors import PluginError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.types import (
    Question,
    RewardResult,
    SearchResponse,
    SearchResult,
)
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.kit.protocols.tool_calls import SEARCH_TOOL, ToolCallsProtocol
from searchr1.plugins.rewards import components
from searchr1.rl.rollout import rollout_questions

Q = Question(id="q", question="  Who is the author of The Little Prince? ", golden_answers=("x",))


@pytest.fixture(scope="module")
def tags() -> TagsProtocol:
    return TagsProtocol(tiny_tokenizer())


@pytest.fixture(scope="module")
def tools() -> ToolCallsProtocol:
    return ToolCallsProtocol(tiny_tokenizer())


@pytest.fixture(scope="module")
def qwen3_5() -> ToolCallsProtocol:
    """Qwen3.5's XML calls with thinking on (the prompt opens a think block)."""
    return ToolCallsProtocol(template_tokenizer("qwen3_5"), enable_thinking=True)


class _NoTemplate:
    """A base-model tokenizer: no chat template."""

    eos_token_id = None
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


# ------------------------------------------------------------------ prompts


def test_tags_prompt_is_the_search_r1_instruction_in_the_chat_template(tags) -> None:
    text = tags.render_prompt(Q)
    assert text.startswith("<|im_start|>user\nAnswer the given question.")
    assert "Question: Who is the author of The Little Prince?\n<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tags.initial_prompt_tokens(Q) == tiny_tokenizer().encode(text, add_special_tokens=False)


def test_tags_prompt_without_chat_template_is_plain_text() -> None:
    text = TagsProtocol(_NoTemplate()).render_prompt(Q)
    assert text.startswith("Answer the given question.") and text.endswith(
        "Question: Who is the author of The Little Prince?\n"
    )


def test_tool_calls_prompt_lists_the_search_tool(tools) -> None:
    text = tools.render_prompt(Q)
    assert json.dumps(SEARCH_TOOL) in text
    assert "Answer: <short answer>" in text and text.endswith("<|im_start|>assistant\n")


def test_tool_calls_needs_a_chat_template() -> None:
    with pytest.raises(ValueError, match='use protocol = "tags"'):
        ToolCallsProtocol(_NoTemplate())


def test_make_protocol_follows_config() -> None:
    tok = tiny_tokenizer()
    registry = load_registry()
    assert make_protocol(Config(), tok, registry).name == "tool_calls"  # the default
    cfg = Config().replace(rollout={"protocol": "tool_calls"})
    assert isinstance(make_protocol(cfg, tok, registry), ToolCallsProtocol)
    with pytest.raises(PluginError, match="rollout.protocol = 'xml': no agent protocol"):
        make_protocol(Config().replace(rollout={"protocol": "xml"}), tok, registry)


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("text", "action"),
    [
        (
            "<think> hm </think> <search> capital of France </search>",
            Action("search", "capital of France"),
        ),
        ("<search> a </search> <answer> b </answer>", Action("search", "a")),
        ("<answer> Paris </answer><search> a </search>", Action("answer", answer="Paris")),
        ("<answer>\n  two\nlines </answer>", Action("answer", answer="two\nlines")),
        ("<answer></answer>", Action("answer", answer="")),
        ("<search> unfinished", Action("invalid")),
        ("<search>   </search>", Action("invalid")),  # an empty query is a model error
        ("<search> a </answer>", Action("invalid")),
        ("Paris.", Action("invalid")),
    ],
)
def test_tags_parse_the_first_complete_element(tags, text, action) -> None:
    assert tags.parse_action(text) == action


CALL = (
    '<tool_call>\n{"name": "search", "arguments": {"query": "little prince author"}}\n</tool_call>'
)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        (CALL, Action("search", "little prince author")),
        (
            "<think>\nhm\n</think>\n\nAnswer: Saint-Exupéry",
            Action("answer", answer="Saint-Exupéry"),
        ),
        (f"Answer: first\n{CALL}", Action("answer", answer="first")),
        (f"{CALL}\nAnswer: later", Action("search", "little prince author")),
        (
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}</tool_call>',
            Action("search", "q"),
        ),
        (
            '<tool_call>{"name": "browse", "arguments": {"query": "q"}}</tool_call>',
            Action("invalid"),
        ),
        (
            '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>',
            Action("invalid"),
        ),
        ("<tool_call>not json</tool_call>", Action("invalid")),
        ("Answer:\nnothing after it", Action("invalid")),
        ("The answer is Paris.", Action("invalid")),
    ],
)
def test_tool_calls_parse_the_earliest_action(tools, text, action) -> None:
    assert tools.parse_action(text) == action


def test_extract_answers_counts_every_occurrence(tags, tools) -> None:
    assert tags.extract_answers("<answer> a </answer> x <answer>b</answer>") == ["a", "b"]
    assert tools.extract_answers("Answer: a\nthinking\n  Answer:   b  \nAnswer:") == ["a", "b", ""]


def test_a_new_protocol_owns_its_answers_in_rewards_and_smoke() -> None:
    """The rollout applies the run's protocol's own format rule and records the verdict on
    the trajectory; the format reward and smoke's verdict read it, so a protocol added to the
    registry is honoured by both without either naming it."""

    class Final(TagsProtocol):
        name = "final"
        answer_format = "one FINAL=<answer> line"

        @classmethod
        def extract_answers(cls, text: str) -> list[str]:
            return [line[6:] for line in text.splitlines() if line.startswith("FINAL=")]

        def parse_action(self, text: str) -> Action:
            answers = self.extract_answers(text)
            return Action("answer", answer=answers[-1]) if answers else super().parse_action(text)

    class Plugin:
        @hookimpl
        def register_agent_protocols(self, register):  # type: ignore[no-untyped-def]
            register(Final.name, Final)

    registry = load_registry(extra_plugins=[Plugin()])
    config = Config().replace(rollout={"protocol": "final"})
    protocol = make_protocol(config, tiny_tokenizer(), registry)
    assert isinstance(protocol, Final)
    scripts = [
        ["I read it.\nFINAL=Lyon"],
        ["FINAL=Lyon\nFINAL=Lyon"],  # two FINAL= lines: ambiguous
        ["<answer>Lyon</answer>"],  # the tags format is not this protocol's
    ]
    model = ScriptedModel(protocol.tokenizer, scripts)
    question = Question("q", "Where?", ("Lyon",))
    (group,) = asyncio.run(
        rollout_questions(model, FakeSearch(), protocol, [question], config, group_size=3)
    )
    assert [t.final_answer for t in group] == ["Lyon", "Lyon", "Lyon"]
    assert [t.format_ok for t in group] == [True, False, False]
    assert [components(t, ["Lyon"])["format"] for t in group] == [1.0, 0.0, 0.0]

    criteria = reference_criteria(
        group, [RewardResult(1.0, {"format": 1.0})] * 3, protocol=protocol,
        max_search_calls=4, search_success=1.0, min_success_rate=0.9,
    )  # fmt: skip
    formats = [c for c in criteria if c.key == "answer_format"]
    assert formats[0].name == "answers in the final format (one FINAL=<answer> line)"
    assert formats[0].detail.startswith("1 of 3 answered in the format")


# ------------------------------------------------------------------ observations


def test_search_results_are_formatted_like_search_r1(tags) -> None:
    response = SearchResponse(
        (SearchResult("Little Prince", "A novella\nby  Antoine."), SearchResult("Lyon", "A city."))
    )
    assert tags.observation_text(response) == (
        "Doc 1(Title: Little Prince) A novella by Antoine.\nDoc 2(Title: Lyon) A city."
    )
    assert tags.observation_text(SearchResponse(error="quota exhausted (429)")) == (
        "search failed: quota exhausted (429)"
    )
    assert tags.observation_text(SearchResponse()) == "no results"


def test_observation_body_is_cut_but_the_closing_tag_is_kept(tags) -> None:
    tokens, text = tags.render_observation_tokens("word " * 200, [], 10)
    assert text.startswith("\n\n<information>") and text.endswith("</information>\n\n")
    before, after = tags.observation_wrapper([])
    assert len(tokens) == len(before) + 10 + len(after)


def test_tool_observation_closes_the_assistant_message_once(tools) -> None:
    tok = tiny_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    open_turn = tok.encode(CALL, add_special_tokens=False)
    _, text = tools.render_observation_tokens("Doc 1(Title: T) x", open_turn, 50)
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: T) x\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    _, closed = tools.render_observation_tokens("x", open_turn + [im_end], 50)
    assert closed.startswith("\n<|im_start|>user\n<tool_response>\nx\n")


def test_observation_matches_the_chat_template_rendering(tools) -> None:
    """Prompt + turn + observation decodes to what the template renders for the same chat."""
    tok = tiny_tokenizer()
    turn = tools.assistant_turn_tokens(query="q")
    obs, _ = tools.render_observation_tokens("RESULT", turn, 50)
    ids = tools.initial_prompt_tokens(Q) + turn + obs
    content = tools.render_prompt(Q).split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
    expected = tok.apply_chat_template(
        [
            {"role": "user", "content": content},
            {"role": "assistant", "content": tools.assistant_turn_text(query="q")},
            {"role": "tool", "content": "RESULT"},
        ],
        tools=[SEARCH_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tok.decode(ids, skip_special_tokens=False) == expected


# ------------------------------------------------------------------ scripted turns


def test_scripted_turns_end_where_the_sampler_stops(tags, tools) -> None:
    tok = tiny_tokenizer()
    assert (
        tags.assistant_turn_text(think="t", query="q") == "<think> t </think>\n<search> q </search>"
    )
    assert tags.assistant_turn_text(answer="a") == "<answer> a </answer>"
    assert tools.assistant_turn_text(query="q").endswith("</tool_call>")
    answer = tools.assistant_turn_tokens(answer="Paris")
    assert (
        answer[-1] == tok.convert_tokens_to_ids("<|im_end|>") and answer[-1] in tools.stop_token_ids
    )
    with pytest.raises(ValueError, match="exactly one"):
        tags.assistant_turn_text(think="t")


_query_text = st.text(
    alphabet=st.characters(blacklist_characters="<>\n\r", blacklist_categories=("Cs", "Cc")),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() and "Answer:" not in s)


@settings(max_examples=60, deadline=None)
@given(query=_query_text, answer=_query_text)
def test_scripted_turns_parse_back_to_their_action(tags, tools, qwen3_5, query, answer) -> None:
    for protocol in (tags, tools, qwen3_5):
        text = protocol.decode(protocol.assistant_turn_tokens(think="why", query=query))
        assert protocol.parse_action(text) == Action("search", query=query.strip())
        text = protocol.decode(protocol.assistant_turn_tokens(answer=answer))
        assert protocol.parse_action(text) == Action("answer", answer=answer.strip())


def test_tool_observation_survives_templates_that_render_the_last_message_differently() -> None:
    """Qwen3-style templates add an empty think block to the *last* assistant message only;
    the splice must still equal the template's rendering of the conversation."""
    from searchr1.plugins.offline_world.tiny_model import (
        BUILTIN_TEXT,
        CHAT_TEMPLATE,
        build_tokenizer,
    )

    plain = "'<|im_start|>assistant\\n' + (message.content or '')"
    assert plain in CHAT_TEMPLATE
    tok = build_tokenizer(BUILTIN_TEXT, 1024)
    tok.chat_template = CHAT_TEMPLATE.replace(
        plain,
        "'<|im_start|>assistant\\n' + ('<think>\\n\\n</think>\\n\\n' if loop.last else '')"
        " + (message.content or '')",
    )
    protocol = ToolCallsProtocol(tok)
    turn = protocol.assistant_turn_tokens(query="q")
    obs, text = protocol.render_observation_tokens("RESULT", turn, 50)
    assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nRESULT")
    assert protocol.assistant_turn_tokens(answer="a")[-1] == tok.convert_tokens_to_ids("<|im_end|>")


def test_observation_follows_the_templates_trim_wherever_the_body_is_cut(qwen3_5) -> None:
    """The official Qwen3.5 template renders tool content ``| trim``: an observation body cut
    on a space must splice in as the template renders it (``Doc\\n</tool_response>``, not
    ``Doc \\n</tool_response>``), for every cut point."""
    assert qwen3_5.trims_observations
    mark = "\x00M\x00"
    body = "Doc 1(Title: Lyon) Lyon is a city in France. "
    turn = qwen3_5.assistant_turn_tokens(query="q")
    n = len(qwen3_5.encode(body))
    for k in range(1, n + 1):
        _, text = qwen3_5.render_observation_tokens(body, turn, k)
        seen = qwen3_5.decode(qwen3_5.encode(body)[:k], skip_special_tokens=False)
        rendered = qwen3_5._template(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": mark},
                {"role": "tool", "content": seen},
            ],
            True,
        )
        assert text == rendered.split(mark, 1)[1], (k, seen)
    _, text = qwen3_5.render_observation_tokens("Doc ", turn, 50)
    assert "Doc\n</tool_response>" in text
    # a template that keeps whitespace keeps it
    plain = ToolCallsProtocol(tiny_tokenizer())
    assert not plain.trims_observations
    own_turn = plain.assistant_turn_tokens(query="q")
    assert "Doc \n</tool_response>" in plain.render_observation_tokens("Doc ", own_turn, 50)[1]
