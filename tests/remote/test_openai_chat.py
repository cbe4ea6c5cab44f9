"""The ``openai_chat`` provider against a loopback fake of the chat-completions API: a tool-call
conversation round-trips through the same agent protocols the rollout uses, the tags protocol's
continuation is refused or sent as vLLM's continue_final_message, failures are retried or
reported clearly, and ``searchr1 train`` refuses the provider (its model has no trainer)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator

import pytest
from fake_chat_server import API_KEY, FakeChatServer

from searchr1.core.agent_protocol import Action
from searchr1.core.config_schema import Config
from searchr1.core.errors import RemoteAuthError, RemoteRejected, RemoteServerError
from searchr1.core.plugins import load_registry
from searchr1.core.types import Question, SamplingParams, SearchResponse, SearchResult
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.kit.protocols.tool_calls import SEARCH_TOOL, ToolCallsProtocol
from searchr1.plugins.openai_chat import ChatServiceError, OpenAIChatProvider, parse_chatml

QUESTION = Question(id="q1", question="What is the capital of France?", golden_answers=("Paris",))
RESULTS = SearchResponse(results=(SearchResult(title="France", text="Paris is the capital."),))


@pytest.fixture(scope="module")
def server():
    with FakeChatServer() as fake:
        yield fake


def make_config(server: FakeChatServer, **table: object) -> Config:
    config = Config(assets=load_registry().assets).replace(
        model={
            "provider": "openai_chat",
            "api_base": server.base_url,
            "api_key": API_KEY,
            "base_model": "builtin:tiny-random",
        }
    )
    table = {"model": "qwen-test", "retry_backoff_seconds": 0.01, **table}
    return dataclasses.replace(config, plugins={"model.openai_chat": table})


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.Runner]:
    """The module's one event loop: the shared ``provider``'s pool belongs to it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def provider(server, loop: asyncio.Runner):
    model = load_registry().create("model_provider", "openai_chat", make_config(server))
    assert model.trainer is None  # it only samples
    yield model.sampler
    loop.run(model.aclose())


def sampling(protocol, n_tokens: int = 64) -> SamplingParams:
    return SamplingParams(
        max_tokens=n_tokens,
        stop_strings=protocol.stop_strings,
        stop_token_ids=protocol.stop_token_ids,
    )


def next_prompt(protocol, prompt: list[int], turn: tuple[int, ...]) -> list[int]:
    """What the rollout feeds back after a search: turn, wrapper, observation, wrapper."""
    before, after = protocol.observation_wrapper(turn)
    body = protocol.encode(protocol.observation_text(RESULTS))
    return prompt + list(turn) + before + body + after


def test_tool_call_conversation_round_trips_through_the_protocol(loop, provider, server):
    protocol = ToolCallsProtocol(provider.tokenizer)
    prompt = protocol.initial_prompt_tokens(QUESTION)
    params = sampling(protocol)
    server.reply(tool_calls=[{"name": "search", "arguments": {"query": "capital of France"}}])
    seqs = loop.run(provider.sample(prompt, 2, params))
    sent = server.requests[-1]
    assert sent["model"] == "qwen-test" and sent["n"] == 2
    assert sent["tools"] == [SEARCH_TOOL]
    assert sent["stop"] == ["</tool_call>"]
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert "Question: What is the capital of France?" in sent["messages"][0]["content"]
    assert len(seqs) == 2
    turn = seqs[0]
    assert turn.stop_reason == "stop" and turn.logprobs == (0.0,) * len(turn.tokens)
    action = protocol.parse_action(protocol.decode(turn.tokens))
    assert (action.kind, action.query) == ("search", "capital of France")

    server.reply(content="The capital is Paris.\nAnswer: Paris")
    final = loop.run(provider.sample(next_prompt(protocol, prompt, turn.tokens), 1, params))[0]
    sent = server.requests[-1]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    call = sent["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "search"
    assert sent["messages"][2]["tool_call_id"] == call["id"]
    assert "Paris is the capital." in sent["messages"][2]["content"]
    assert protocol.decode(final.tokens, skip_special_tokens=False).endswith("<|im_end|>")
    action = protocol.parse_action(protocol.decode(final.tokens))
    assert (action.kind, action.answer) == ("answer", "Paris")


def test_tags_protocol_restores_the_stop_tag_and_needs_continuation(loop, server):
    plain = OpenAIChatProvider.from_config(make_config(server))
    protocol = TagsProtocol(plain.tokenizer)
    prompt = protocol.initial_prompt_tokens(QUESTION)
    server.reply(content="<think> look it up </think> <search> capital of France ")
    turn = loop.run(plain.sample(prompt, 1, sampling(protocol)))[0]
    action = protocol.parse_action(protocol.decode(turn.tokens))
    assert (action.kind, action.query) == ("search", "capital of France")

    follow_up = next_prompt(protocol, prompt, turn.tokens)
    with pytest.raises(ChatServiceError, match="continue_final_message"):
        loop.run(plain.sample(follow_up, 1, sampling(protocol)))

    vllm = OpenAIChatProvider.from_config(make_config(server, continue_final_message=True))
    server.reply(content="<answer> Paris </answer>")
    final = loop.run(vllm.sample(follow_up, 1, sampling(protocol)))[0]
    sent = server.requests[-1]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["messages"][-1]["role"] == "assistant"
    assert "<information>" in sent["messages"][-1]["content"]
    assert protocol.parse_action(protocol.decode(final.tokens)).answer == "Paris"


def test_length_finish_is_reported(loop, provider, server):
    server.reply(content="a long answer that was cut", finish_reason="length")
    seq = loop.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=50)))[0]
    assert seq.stop_reason == "length"


def test_429_and_5xx_are_retried(loop, provider, server):
    answered = len(server.requests)
    server.fail(429, times=1, retry_after="0")
    server.fail(503, times=1)
    seqs = loop.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=8)))
    assert len(seqs) == 1 and len(server.requests) == answered + 1


def test_persistent_failure_gives_up_with_a_clear_error(loop, server):
    provider = OpenAIChatProvider.from_config(make_config(server, max_retries=1))
    server.fail(503, times=2, message=f"overloaded (key {API_KEY})")
    with pytest.raises(RemoteServerError) as info:
        loop.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=8)))
    message = str(info.value)
    assert f"POST {server.base_url}/v1/chat/completions: HTTP 503" in message
    assert "2 attempts" in message and "overloaded (key ***)" in message
    assert API_KEY not in message


def test_a_bad_request_is_not_retried(loop, provider, server):
    server.fail(400, times=2, message="unknown field")
    params = SamplingParams(max_tokens=8)
    with pytest.raises(RemoteRejected, match=r"HTTP 400.*unknown field.*, 1 attempt\)"):
        loop.run(provider.sample([1, 2, 3], 1, params))
    # the second 400 is still queued: the first call did not retry
    with pytest.raises(RemoteRejected, match="HTTP 400"):
        loop.run(provider.sample([1, 2, 3], 1, params))
    assert len(loop.run(provider.sample([1, 2, 3], 1, params))) == 1


def test_retry_after_is_waited_for(loop, server):
    provider = OpenAIChatProvider.from_config(make_config(server))
    server.fail(429, retry_after="1")
    start = time.monotonic()
    loop.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=8)))
    assert time.monotonic() - start >= 1.0  # the backoff alone waits <= 0.01 s


def test_samples_of_one_loop_share_one_connection(loop, server):
    provider = OpenAIChatProvider.from_config(make_config(server))
    before = server.connections

    async def three() -> None:
        for _ in range(3):
            await provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=8))
        await provider.aclose()

    loop.run(three())
    assert server.connections - before == 1


def test_rejected_key_is_a_clear_error(loop, server):
    config = make_config(server).replace(model={"api_key": "sk-wrong-1234567"})
    provider = OpenAIChatProvider.from_config(config)
    with pytest.raises(RemoteAuthError, match="model.api_key is empty or wrong") as info:
        loop.run(provider.sample([1, 2, 3], 1, SamplingParams(max_tokens=8)))
    assert "sk-wrong-1234567" not in str(info.value)


def test_train_refuses_the_provider_before_any_request(server, tmp_path, config_file, run_cli):
    (tmp_path / "corpus.jsonl").write_text('{"id": "1", "title": "France", "text": "Paris."}\n')
    (tmp_path / "train.jsonl").write_text(
        '{"question": "Capital of France?", "answers": ["Paris"]}\n'
    )
    config = config_file(
        f'[model]\nprovider = "openai_chat"\napi_base = "{server.base_url}"\n'
        f'api_key = "{API_KEY}"\nbase_model = "builtin:tiny-random"\n'
        '[model.openai_chat]\nmodel = "qwen-test"\n'
        '[rollout]\nprotocol = "tool_calls"\n'
        f'[search]\nprovider = "local"\n[search.local]\ncorpus = "{tmp_path / "corpus.jsonl"}"\n'
        f'[data]\ntrain = "{tmp_path / "train.jsonl"}"\n'
    )
    sent = len(server.requests)
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    err = result.err
    assert result.code == 2, err
    assert "model.provider = 'openai_chat' only samples" in err and "searchr1 eval" in err, err
    assert len(server.requests) == sent  # refused before any rollout


def test_plain_text_prompt_becomes_one_user_message():
    conv = parse_chatml("just a question")
    assert conv.messages == [{"role": "user", "content": "just a question"}]
    assert conv.partial is None


def test_qwen3_5_xml_calls_and_thinking_round_trip(loop, server, tmp_path):
    """A Qwen3.5-template tokenizer: the think prefill is left to the server (told the mode),
    XML calls in the prompt become ``tool_calls`` and the server's calls and reasoning come
    back as the XML and think text the protocol parses."""
    from fakes import template_tokenizer

    template_tokenizer("qwen3_5").save_pretrained(tmp_path / "tok")
    chat = OpenAIChatProvider.from_config(make_config(server, tokenizer=str(tmp_path / "tok")))
    protocol = ToolCallsProtocol(chat.tokenizer, enable_thinking=True)
    assert chat.call_format.name == protocol.call_format.name == "xml"
    prompt = protocol.initial_prompt_tokens(QUESTION)
    params = sampling(protocol)
    server.reply(
        reasoning="Look it up.",
        tool_calls=[{"name": "search", "arguments": {"query": "capital of France"}}],
    )
    (turn,) = loop.run(chat.sample(prompt, 1, params))
    sent = server.requests[-1]
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert "continue_final_message" not in sent and sent["tools"] == [SEARCH_TOOL]
    text = protocol.decode(turn.tokens)
    assert text.startswith("Look it up.\n</think>\n\n<tool_call>\n<function=search>\n")
    assert protocol.parse_action(text) == Action("search", "capital of France")

    server.reply(content="Answer: Paris", reasoning="Answer: Lyon? No, the result says Paris.")
    (final,) = loop.run(chat.sample(next_prompt(protocol, prompt, turn.tokens), 1, params))
    sent = server.requests[-1]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    (call,) = sent["messages"][1]["tool_calls"]
    assert call["function"] == {"name": "search", "arguments": '{"query": "capital of France"}'}
    assert protocol.parse_action(protocol.decode(final.tokens)) == Action("answer", answer="Paris")
