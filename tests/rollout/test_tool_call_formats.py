"""The ``tool_calls`` protocol on each model family's own chat template.

``tests/chat_templates/qwen3.jinja`` and ``qwen3_5.jinja`` are test templates written for
searchr1 from the public Qwen3 and Qwen3.5 formats (tool list in the system turn, JSON or XML
calls, grouped ``<tool_response>`` turns, think blocks; Qwen3.5 opens every generation with
``<think>\\n`` when thinking is on). They are put on the tiny tokenizer, which has the control
tokens and tags as single tokens like the real ones. Every test runs each template with
thinking off and on (``[rollout] enable_thinking``).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import FakeSearch, ScriptedModel, template_tokenizer

from searchr1.core.agent_protocol import Action
from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigValueError
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.types import Question, SearchResponse, SearchResult
from searchr1.kit.protocols.tool_calls import SEARCH_TOOL, ToolCallsProtocol
from searchr1.plugins.rewards import components
from searchr1.rl.rollout import rollout_questions

Q = Question(id="q", question="Who wrote The Little Prince?", golden_answers=("Saint-Exupéry",))

#: (template, enable_thinking) -> (call format, what the generation prompt says on thinking)
CASES = {
    ("qwen3", False): ("json", False),
    ("qwen3", True): ("json", None),
    ("qwen3_5", False): ("xml", False),
    ("qwen3_5", True): ("xml", True),
}

#: Calls exactly as each family writes them (not produced by searchr1's renderer).
QWEN3_CALL = (
    '<tool_call>\n{"name": "search", "arguments": {"query": "little prince author"}}\n</tool_call>'
)
QWEN3_5_CALL = (
    "<tool_call>\n<function=search>\n<parameter=query>\nlittle prince author\n</parameter>\n"
    "</function>\n</tool_call>"
)
CALLS = {"qwen3": QWEN3_CALL, "qwen3_5": QWEN3_5_CALL}


def protocol(template: str, thinking: bool) -> ToolCallsProtocol:
    cfg = Config().replace(rollout={"protocol": "tool_calls", "enable_thinking": thinking})
    made = make_protocol(cfg, template_tokenizer(template), load_registry())
    assert isinstance(made, ToolCallsProtocol)
    return made


@pytest.fixture(params=sorted(CASES), ids=lambda c: f"{c[0]}-thinking_{'on' if c[1] else 'off'}")
def case(request: pytest.FixtureRequest) -> tuple[str, bool, ToolCallsProtocol]:
    template, thinking = request.param
    return template, thinking, protocol(template, thinking)


# ------------------------------------------------------------------ format detection


def test_the_format_and_thinking_mode_are_read_off_the_template(case) -> None:
    template, thinking, proto = case
    call_format, opens = CASES[(template, thinking)]
    assert proto.call_format.name == call_format
    assert proto.opens_in_thinking is opens
    prompt = proto.render_prompt(Q)
    assert json.dumps(SEARCH_TOOL) in prompt  # the tool list, in the system turn
    if template == "qwen3_5":
        assert "<function=example_function_name>" in prompt
        assert prompt.endswith("<think>\n" if thinking else "<think>\n\n</think>\n\n")
    else:
        assert '{"name": <function-name>, "arguments": <args-json-object>}' in prompt


def test_smoke_description_names_the_format_and_shows_the_prompt(case) -> None:
    template, _, proto = case
    text = proto.describe(Q)
    assert f"call format: {proto.call_format.name}" in text
    assert repr(proto.call_format.example()) in text
    assert proto.render_prompt(Q) + "[end of prompt]" in text


def test_an_unknown_call_format_is_refused_at_construction() -> None:
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tok = build_tokenizer(BUILTIN_TEXT, 1024)
    # A Mistral-like template: calls as [TOOL_CALLS] JSON lists, a format searchr1 lacks.
    tok.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' %}"
        "{%- for c in (m.tool_calls or []) %}[TOOL_CALLS][{{ c.function | tojson }}]"
        "{%- endfor %}{%- endif %}{{ m.content or '' }}{%- endfor %}"
    )
    with pytest.raises(
        ConfigValueError, match=r"(?s)no installed plugin knows.*\[TOOL_CALLS\].*xml"
    ):
        ToolCallsProtocol(tok)
    tok.chat_template = "{%- for m in messages %}{{ m.content or '' }}{%- endfor %}"
    with pytest.raises(ConfigValueError, match="the call was dropped"):
        ToolCallsProtocol(tok)


# ------------------------------------------------------------------ parsing


def test_the_family_call_is_a_search_and_the_other_family_call_is_not(case) -> None:
    template, thinking, proto = case
    head = "I should look it up.\n</think>\n\n" if proto.opens_in_thinking else ""
    own = CALLS[template]
    other = CALLS["qwen3" if template == "qwen3_5" else "qwen3_5"]
    assert proto.parse_action(head + own) == Action("search", "little prince author")
    assert proto.parse_action(head + other) == Action("invalid")


def test_answers_and_calls_inside_think_blocks_are_not_actions(case) -> None:
    template, thinking, proto = case
    drafts = f"Maybe\nAnswer: Lyon\nor {CALLS[template]}"
    if proto.opens_in_thinking:  # Qwen3.5, thinking on: the prompt opened the block
        turn = f"{drafts}\n</think>\n\nAnswer: Saint-Exupéry"
        assert proto.parse_action(drafts) == Action("invalid")  # never left its thoughts
    else:
        turn = f"<think>\n{drafts}\n</think>\n\nAnswer: Saint-Exupéry"
        assert proto.parse_action(f"<think>\n{drafts}") == Action("invalid")  # unclosed
    assert proto.parse_action(turn) == Action("answer", answer="Saint-Exupéry")
    assert proto.extract_answers(turn) == ["Saint-Exupéry"]


def test_xml_calls_are_read_leniently_but_not_blindly() -> None:
    proto = protocol("qwen3_5", False)
    compact = (
        "<tool_call><function=search><parameter=query>q one</parameter></function></tool_call>"
    )
    assert proto.parse_action(compact) == Action("search", "q one")
    for bad in (
        QWEN3_5_CALL.replace("function=search", "function=browse"),
        QWEN3_5_CALL.replace("little prince author", "  "),
        QWEN3_5_CALL.replace("parameter=query", "parameter=q"),
        QWEN3_5_CALL.replace("</parameter>\n", "</parameter>\nstray words\n"),
        QWEN3_5_CALL.replace("</function>\n", ""),
    ):
        assert proto.parse_action(bad) == Action("invalid"), bad


# ------------------------------------------------------------------ scripted turns and splice


def test_scripted_turns_are_what_the_template_writes_for_the_same_conversation(case) -> None:
    """Prompt + scripted turns + observations, as token ids, decode to the template's own
    rendering of the structured conversation (reasoning in the content, the call as
    ``tool_calls``). Qwen3 with thinking off is the exception: its template drops the empty
    think block of earlier turns, so only the rendering up to the last call is compared."""
    template, thinking, proto = case
    tok = template_tokenizer(template)
    think = None if proto.opens_in_thinking is False else "first look it up"
    ids = proto.initial_prompt_tokens(Q)
    calls = proto.assistant_turn_tokens(think=think, query="little prince author")
    assert proto.parse_action(proto.decode(calls)) == Action("search", "little prince author")
    ids += calls
    ids += proto.render_observation_tokens("Doc 1(Title: T) text", calls, 64)[0]
    answer = proto.assistant_turn_tokens(think=think, answer="Saint-Exupéry")
    assert proto.parse_action(proto.decode(answer)) == Action("answer", answer="Saint-Exupéry")
    ids += answer

    reasoning = f"<think>\n{think}\n</think>\n\n" if think else ""
    user = proto.render_prompt(Q).split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
    call = {
        "type": "function",
        "function": {"name": "search", "arguments": {"query": "little prince author"}},
    }
    conversation = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": reasoning, "tool_calls": [call]},
        {"role": "tool", "content": "Doc 1(Title: T) text"},
        {"role": "assistant", "content": reasoning + "Answer: Saint-Exupéry"},
    ]
    rendered = tok.apply_chat_template(
        conversation, tools=[SEARCH_TOOL], tokenize=False, enable_thinking=thinking
    )
    text = tok.decode(ids, skip_special_tokens=False)
    if (template, thinking) == ("qwen3", False):
        tail = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        assert text.startswith(proto.render_prompt(Q)) and rendered.count(tail) == 1
        assert text.replace(tail, "<|im_start|>assistant\n", 1) + "\n" == rendered
    else:
        assert text + "\n" == rendered


def test_rollout_on_each_template_keeps_the_splice_and_scores_the_answer(case) -> None:
    """A scripted model writes what each family writes, drafts inside its thinking included;
    the rollout searches once, stops on the answer, every later prompt starts with the
    earlier prompt and its sampled tokens, and the reward counts the one real answer."""
    template, thinking, proto = case
    tok = template_tokenizer(template)
    head = {True: "{t}\n</think>\n\n", False: "", None: "<think>\n{t}\n</think>\n\n"}
    head = head[proto.opens_in_thinking]
    first = head.format(t="Answer: Paris? no, search.") + CALLS[template]
    last = head.format(t="Answer: Paris was wrong") + "Answer: Saint-Exupéry<|im_end|>"
    model = ScriptedModel(tok, [[first, last], [last]])
    search = FakeSearch(
        {"little prince author": SearchResponse((SearchResult("LP", "by Saint-Exupéry"),))}
    )
    cfg = Config().replace(
        rollout={"protocol": "tool_calls", "enable_thinking": thinking, "max_search_calls": 2},
        model={"max_new_tokens": 200},
    )
    (group,) = asyncio.run(rollout_questions(model, search, proto, [Q], cfg, group_size=2))
    searched, direct = group
    assert search.queries == ["little prince author"]
    assert [t.action for t in searched.turns] == ["search", "answer"]
    assert searched.final_answer == direct.final_answer == "Saint-Exupéry"
    assert "by Saint-Exupéry" in searched.turns[0].observation_text
    first_call, second_call = model.calls[0], model.calls[1]
    assert second_call.prompt[: len(first_call.prompt)] == first_call.prompt
    sampled = searched.turns[0].sampled_tokens
    assert second_call.prompt[len(first_call.prompt) :][: len(sampled)] == sampled
    assert second_call.prompt == searched.tokens[: len(second_call.prompt)]
    for traj in group:
        parts = components(traj, Q.golden_answers)
        assert parts["format"] == 1.0 and parts["correct"] == 1.0, traj.turns


# ------------------------------------------------------------------ smoke


def test_smoke_shows_the_prompt_and_call_format_and_scores_qwen3_5_turns(
    tmp_path, run_cli, scripted_plugin
) -> None:
    """``searchr1 smoke`` on a Qwen3.5-template model with ``tool_calls``: it prints the
    rendered prompt with the tool list and names the XML format; turns written the Qwen3.5
    way (thinking prefilled, XML call) search, answer and score 1.0."""
    from smoke_configs import TRAJECTORY_LINE, local_search, smoke, write_config

    call = QWEN3_5_CALL.replace("little prince author", "The Little Prince")
    turns = [
        ["Let me search.\n</think>\n\n" + call,
         "Answer: Lyon? No: the first result.\n</think>\n\nAnswer: Antoine de Saint-Exupéry<|im_end|>"],
        ["Answer: Lyon? Check.\n</think>\n\nAnswer: Antoine de Saint-Exupéry<|im_end|>"],
    ]  # fmt: skip
    model = (
        '[model]\nprovider = "scripted"\nmax_new_tokens = 64\n'
        f'[model.scripted]\nchat_template = "qwen3_5"\nturns = {json.dumps(turns)}\n'
    )
    rollout = 'protocol = "tool_calls"\nenable_thinking = true'
    config = write_config(tmp_path, model, local_search(tmp_path), rollout)
    text = config.read_text(encoding="utf-8").replace("= 512", "= 4096")  # a long tool prompt
    config.write_text(text, encoding="utf-8")
    question = "Who is the author of The Little Prince and where was he born?"
    args = ["--question", question, "--answer", "Antoine de Saint-Exupéry", "--group-size", "2"]
    code, out = smoke(run_cli, config, *args)
    assert code == 3, out  # the channels work; trajectory 1 answers without searching
    assert "verdict: searches within 1..4: FAILED (trajectories 1 (0)" in out
    assert "call format: xml (Qwen3.5" in out
    assert "<parameter=query>\\n<your query>\\n</parameter>" in out
    assert "rendered prompt:\n<|im_start|>system\n# Tools\n" in out
    assert json.dumps(SEARCH_TOOL) in out and "<think>\n[end of prompt]" in out
    assert TRAJECTORY_LINE.findall(out) == [
        ("0", "1.0", "1", "Antoine de Saint-Exupéry"),
        ("1", "1.0", "0", "Antoine de Saint-Exupéry"),
    ]


def test_tags_a_tokenizer_marks_special_are_still_read() -> None:
    """Where ``<think>`` / ``<tool_call>`` are special tokens, decoding a turn for reading
    keeps them (skipping special tokens alone would drop them and every call would read as
    invalid), while end-of-message tokens are still skipped."""
    from tokenizers import AddedToken

    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tok = build_tokenizer(BUILTIN_TEXT, 1024)
    tok.chat_template = template_tokenizer("qwen3_5").chat_template
    tags = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
    special = [AddedToken(t, special=True, normalized=False) for t in tags]
    tok.add_special_tokens({"additional_special_tokens": special})
    proto = ToolCallsProtocol(tok, enable_thinking=True)
    turn = proto.encode(f"Answer: Lyon?\n</think>\n\n{QWEN3_5_CALL}")
    assert tok.decode(turn, skip_special_tokens=True).count("<tool_call>") == 0
    assert proto.parse_action(proto.decode(turn)) == Action("search", "little prince author")
    answer = proto.assistant_turn_tokens(think="Answer: Lyon?", answer="Saint-Exupéry")
    assert proto.decode(answer).endswith("</think>\n\nAnswer: Saint-Exupéry")


def test_smoke_refuses_a_template_whose_call_format_is_unknown(
    tmp_path, run_cli, scripted_plugin
) -> None:
    """Exit 2 before any rollout, saying what the template writes and which formats exist."""
    from smoke_configs import local_search, write_config

    model = (
        '[model]\nprovider = "scripted"\nmax_new_tokens = 64\n'
        '[model.scripted]\nchat_template = "bracket_calls"\nturns = [["Answer: x"]]\n'
    )
    config = write_config(tmp_path, model, local_search(tmp_path), 'protocol = "tool_calls"')
    result = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "run")
    out, err = result.out, result.err
    assert result.code == 2, out
    assert "writes tool calls in a format no installed plugin knows" in err
    assert "[TOOL_CALLS]" in err and "Qwen3.5" in err and "Traceback" not in err
    assert not scripted_plugin.created[0].calls  # nothing was sampled
