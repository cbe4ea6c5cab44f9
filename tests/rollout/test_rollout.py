"""The rollout state machine, driven by a scripted policy through every branch.

Token records are asserted exactly: prompt + sampled tokens + observation tokens, with the
generated mask and the sampler log-probs (``-(k+1)`` for turn ``k`` in the scripted model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from fakes import FakeSearch, ScriptedModel, tiny_tokenizer

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.config_schema import Config
from searchr1.core.types import Question, SearchResponse, SearchResult, Trajectory
from searchr1.kit.protocols.tags import TagsProtocol
from searchr1.kit.protocols.tool_calls import ToolCallsProtocol
from searchr1.rl.rollout import rollout_questions, sampling_params

Q = Question(id="q1", question="Who wrote the old book?", golden_answers=("Alice",))
Q2 = Question(id="q2", question="Where was the painter born?", golden_answers=("Oslo",))


def config(**rollout: int | bool) -> Config:
    limits = {"max_search_calls": 3, "max_assistant_turns": 4, "max_trajectory_tokens": 2048}
    limits.update(rollout)
    return Config().replace(rollout=limits, model={"max_new_tokens": 64})


def run(
    scripts: Sequence[Sequence[str]],
    *,
    protocol: AgentProtocol | None = None,
    search: FakeSearch | None = None,
    questions: Sequence[Question] = (Q,),
    cfg: Config | None = None,
    model: ScriptedModel | None = None,
) -> tuple[list[list[Trajectory]], ScriptedModel, FakeSearch, AgentProtocol]:
    tok = tiny_tokenizer()
    protocol = protocol or TagsProtocol(tok)
    model = model or ScriptedModel(tok, scripts)
    search = search or FakeSearch()
    cfg = cfg or config()
    out = asyncio.run(
        rollout_questions(
            model, search, protocol, questions, cfg, group_size=len(scripts) if model.scripts else 1
        )
    )
    return out, model, search, protocol


def enc(text: str) -> list[int]:
    return tiny_tokenizer().encode(text, add_special_tokens=False)


def observation(protocol: AgentProtocol, query: str, turn: str, max_tokens: int = 512) -> list[int]:
    body = protocol.observation_text(
        SearchResponse((SearchResult(title=f"About {query}", text=f"{query} facts"),))
    )
    return protocol.render_observation_tokens(body, enc(turn), max_tokens)[0]


def assert_consistent(t: Trajectory) -> None:
    """The record invariants every trajectory keeps."""
    n = len(t.tokens)
    assert len(t.generated_mask) == n and len(t.logprobs) == n
    assert not any(t.generated_mask[: t.prompt_len])
    rebuilt = list(t.tokens[: t.prompt_len])
    for turn in t.turns:
        rebuilt += list(turn.sampled_tokens) + list(turn.observation_tokens)
    assert tuple(rebuilt) == t.tokens
    assert sum(t.generated_mask) == sum(len(turn.sampled_tokens) for turn in t.turns)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.generated_mask, strict=True) if not m)


def test_answer_on_first_turn_records_prompt_and_sampled_tokens_exactly() -> None:
    a0 = "<think> easy </think>\n<answer> Alice </answer>"
    a1 = "<answer> Bob </answer>"
    (group,), model, search, protocol = run([[a0], [a1]])
    prompt = protocol.initial_prompt_tokens(Q)
    t0, t1 = group
    assert t0.tokens == tuple(prompt + enc(a0))
    assert t0.generated_mask == tuple([False] * len(prompt) + [True] * len(enc(a0)))
    assert t0.logprobs == tuple([0.0] * len(prompt) + [-1.0] * len(enc(a0)))
    assert t0.prompt_len == len(prompt)
    assert (t0.end_reason, t0.final_answer, t1.final_answer) == ("answered", "Alice", "Bob")
    assert (t0.search_calls, t0.search_errors, search.calls) == (0, 0, 0)
    assert t0.trajectory_id == "q1/0" and t1.trajectory_id == "q1/1" and t0.group_id == "q1"
    assert t0.format_ok and t0.turns[0].action == "answer"
    assert len(model.calls) == 1 and model.calls[0].num_samples == 2
    assert model.calls[0].prompt == tuple(prompt)


def test_search_then_answer_appends_observation_tokens_and_masks_them() -> None:
    s = "<think> need facts </think>\n<search> old book author </search>"
    a = "<answer> Alice </answer>"
    (group,), model, search, protocol = run([[s, a], ["<answer> Carol </answer>"]])
    t = group[0]
    prompt = protocol.initial_prompt_tokens(Q)
    obs = observation(protocol, "old book author", s)
    assert t.tokens == tuple(prompt + enc(s) + obs + enc(a))
    mask = [False] * len(prompt) + [True] * len(enc(s)) + [False] * len(obs) + [True] * len(enc(a))
    assert t.generated_mask == tuple(mask)
    lps = [0.0] * len(prompt) + [-1.0] * len(enc(s)) + [0.0] * len(obs) + [-2.0] * len(enc(a))
    assert t.logprobs == tuple(lps)
    assert (t.end_reason, t.final_answer, t.search_calls) == ("answered", "Alice", 1)
    assert search.queries == ["old book author"]
    assert t.turns[0].query == "old book author" and t.turns[0].action == "search"
    assert "<information>Doc 1(Title: About old book author)" in t.turns[0].observation_text
    assert t.turns[0].observation_text.endswith("</information>\n\n")
    assert_consistent(t)
    # The prompt of turn 2 is exactly the tokens of turn 1 plus the observation.
    second = [c for c in model.calls if c.num_samples == 1]
    assert len(second) == 1 and second[0].prompt == tuple(prompt + enc(s) + obs)


def test_every_later_prompt_extends_the_previous_one_token_for_token() -> None:
    turns = ["<search> a </search>", "<search> b </search>", "<answer> c </answer>"]
    (group,), model, _, _ = run([turns, ["<answer> x </answer>"]])
    prompts = [c.prompt for c in model.calls]
    for previous, turn, current in zip(prompts, turns, prompts[1:], strict=False):
        assert current[: len(previous) + len(enc(turn))] == previous + tuple(enc(turn))
    assert [c.num_samples for c in model.calls] == [2, 1, 1]
    assert_consistent(group[0])


def test_search_limit_ends_without_searching() -> None:
    turns = ["<search> a </search>", "<search> b </search>"]
    (group,), _, search, _ = run([turns, ["<answer> x </answer>"]], cfg=config(max_search_calls=1))
    t = group[0]
    assert (t.end_reason, t.search_calls, t.final_answer) == ("search_limit", 1, None)
    assert search.queries == ["a"] and len(t.turns) == 2
    assert t.turns[-1].observation_tokens == () and t.tokens[-1] == t.turns[-1].sampled_tokens[-1]
    assert_consistent(t)


def test_turn_limit_ends_on_the_last_allowed_turn() -> None:
    turns = ["<search> a </search>", "<search> b </search>", "<answer> x </answer>"]
    cfg = config(max_assistant_turns=2, max_search_calls=5)
    (group,), _, search, _ = run([turns, ["<answer> y </answer>"]], cfg=cfg)
    t = group[0]
    assert (t.end_reason, len(t.turns), t.search_calls) == ("turn_limit", 2, 1)
    assert search.queries == ["a"]
    assert_consistent(t)


def test_invalid_action_ends_the_trajectory() -> None:
    (group,), _, search, _ = run([["I am not sure what to do."], ["<search>  </search>"]])
    assert [t.end_reason for t in group] == ["invalid_action", "invalid_action"]
    assert search.calls == 0 and group[0].turns[0].action == "invalid"


def test_token_limit_shrinks_max_tokens_and_ends_when_budget_is_spent() -> None:
    tok = tiny_tokenizer()
    protocol = TagsProtocol(tok)
    prompt_len = len(protocol.initial_prompt_tokens(Q))
    s = "<search> a </search>"
    obs_len = len(observation(protocol, "a", s))
    budget = prompt_len + len(enc(s)) + obs_len + 3  # 3 tokens left for turn 2
    long_turn = "<think> this reasoning goes on and on without any action </think>"
    (group,), model, _, _ = run(
        [[s, long_turn], ["<answer> x </answer>"]], cfg=config(max_trajectory_tokens=budget)
    )
    t = group[0]
    assert model.calls[0].params.max_tokens == min(64, budget - prompt_len)
    assert model.calls[1].params.max_tokens == 3  # shrunk to what is left
    assert t.end_reason == "token_limit" and len(t.tokens) == budget
    assert t.turns[-1].stop_reason == "length" and t.turns[-1].sampled_tokens == tuple(
        enc(long_turn)[:3]
    )
    assert_consistent(t)


def test_observation_that_does_not_fit_ends_with_token_limit() -> None:
    protocol = TagsProtocol(tiny_tokenizer())
    s = "<search> a </search>"
    budget = len(protocol.initial_prompt_tokens(Q)) + len(enc(s)) + 2
    (group,), model, search, _ = run(
        [[s], ["<answer> x </answer>"]], cfg=config(max_trajectory_tokens=budget)
    )
    t = group[0]
    assert (t.end_reason, t.search_calls, len(t.tokens)) == ("token_limit", 1, budget - 2)
    assert t.turns[0].observation_tokens == () and len(model.calls) == 1
    assert_consistent(t)


def test_observation_is_truncated_to_the_configured_token_budget() -> None:
    long_text = " ".join(["word"] * 400)
    search = FakeSearch(responses={"a": SearchResponse((SearchResult("T", long_text),))})
    turns = ["<search> a </search>", "<answer> x </answer>"]
    (group,), _, _, protocol = run(
        [turns, ["<answer> y </answer>"]], search=search, cfg=config(max_observation_tokens=20)
    )
    obs = group[0].turns[0]
    wrapper = sum(len(w) for w in protocol.observation_wrapper(enc(turns[0])))
    assert len(obs.observation_tokens) == wrapper + 20
    assert obs.observation_text.endswith("</information>\n\n")


def test_search_failures_become_observations_and_are_counted() -> None:
    search = FakeSearch(responses={"a": SearchResponse(error="timeout")}, raise_for={"b"})
    turns_a = ["<search> a </search>", "<answer> x </answer>"]
    turns_b = ["<search> b </search>", "<answer> y </answer>"]
    (group,), _, _, _ = run([turns_a, turns_b], search=search)
    ta, tb = group
    assert "<information>search failed: timeout</information>" in ta.turns[0].observation_text
    assert ta.turns[0].search_error == "timeout"
    assert (ta.search_calls, ta.search_errors, ta.end_reason) == (1, 1, "answered")
    # a provider that raises (against its contract) still never crashes the rollout
    assert "search failed: ConnectionError" in tb.turns[0].observation_text
    assert (tb.search_errors, tb.final_answer) == (1, "y")


def test_group_sampling_is_one_call_per_question_then_one_sample_per_turn() -> None:
    scripts = [["<search> a </search>", "<answer> x </answer>"]] + [
        [f"<answer> n{i} </answer>"] for i in range(3)
    ]
    groups, model, _, _ = run(scripts, questions=(Q, Q2))
    assert [len(g) for g in groups] == [4, 4]
    assert [g[0].group_id for g in groups] == ["q1", "q2"]
    firsts = [c for c in model.calls if c.num_samples == 4]
    assert len(firsts) == 2 and len(model.calls) == 4  # 2 group calls + 1 follow-up each
    assert all(c.num_samples == 1 for c in model.calls if c not in firsts)


def test_a_slow_search_does_not_block_other_trajectories_out_of_lockstep() -> None:
    gate = asyncio.Event()
    tok = tiny_tokenizer()
    slow = ["<search> slow </search>", "<answer> s </answer>"]
    fast = ["<search> fast </search>", "<search> again </search>", "<answer> f </answer>"]
    model = ScriptedModel(tok, [slow, fast])

    def release(call) -> None:  # the fast trajectory's last turn: only reachable if not blocked
        if call.num_samples == 1 and tok.decode(list(call.prompt)).count("<information>") == 2:
            gate.set()

    model.on_call = release

    async def go():
        return await asyncio.wait_for(
            rollout_questions(
                model,
                FakeSearch(gates={"slow": gate}),
                TagsProtocol(tok),
                [Q],
                config(lockstep=False),
                group_size=2,
            ),
            timeout=30,
        )

    (group,) = asyncio.run(go())
    assert [t.final_answer for t in group] == ["s", "f"]


def test_lockstep_asks_each_turn_together_in_trajectory_order() -> None:
    """The searches of a turn end in any order (here the first trajectory's last); the next
    turn's requests still reach the sampler together, in question and sample order, so a
    seeded run repeats its sampler batches whatever the search timing."""
    gate = asyncio.Event()
    tok = tiny_tokenizer()
    scripts = [
        ["<search> slow </search>", "<answer> s </answer>"],
        ["<search> fast </search>", "<answer> f </answer>"],
        ["<search> quick </search>", "<search> more </search>", "<answer> q </answer>"],
    ]
    model = ScriptedModel(tok, scripts)
    search = FakeSearch(gates={"slow": gate})

    async def go():
        task = asyncio.ensure_future(
            rollout_questions(model, search, TagsProtocol(tok), [Q], config(), group_size=3)
        )
        for _ in range(50):  # let the fast searches finish while "slow" waits
            await asyncio.sleep(0)
        assert len(model.calls) == 1  # nobody ran ahead of the slow search
        gate.set()
        return await asyncio.wait_for(task, timeout=30)

    (group,) = asyncio.run(go())
    assert [t.final_answer for t in group] == ["s", "f", "q"]
    start = len(model.calls[0].prompt)  # the question's prompt; what follows was sampled
    first_query = [
        tok.decode(list(c.prompt[start:])).split("<search>")[1].split("</search>")[0].strip()
        for c in model.calls[1:]
    ]
    assert first_query == ["slow", "fast", "quick", "quick"]


def test_model_failure_propagates() -> None:
    tok = tiny_tokenizer()
    model = ScriptedModel(tok, [["<answer> a </answer>"]], fail=RuntimeError("401 unauthorized"))
    with pytest.raises(RuntimeError, match="401"):
        asyncio.run(
            rollout_questions(model, FakeSearch(), TagsProtocol(tok), [Q], config(), group_size=1)
        )


def test_every_failure_of_a_batch_is_retrieved(caplog: pytest.LogCaptureFixture) -> None:
    """When several trajectories fail together, the first error is raised and asyncio has no
    "exception was never retrieved" line to print about the others."""
    import gc

    tok = tiny_tokenizer()
    failure = RuntimeError("401 unauthorized")
    model = ScriptedModel(tok, [["<answer> a </answer>"]], fail=failure)
    with caplog.at_level("ERROR", logger="asyncio"), pytest.raises(RuntimeError, match="401"):
        asyncio.run(
            rollout_questions(
                model, FakeSearch(), TagsProtocol(tok), [Q, Q2, Q, Q2], config(), group_size=1
            )
        )
    # A task whose failure nothing read says so when it is freed: free the batch's tasks now
    # (the traceback of the failure they share holds the frame that holds them).
    failure.__traceback__ = None
    gc.collect()
    # Only this batch's tasks hold ``failure``: an earlier test's unreferenced task (an SDK's
    # future in a cycle) may be freed, and reported, while this test runs.
    ours = [r for r in caplog.records if r.exc_info and _raised(failure, r.exc_info[1])]
    assert not [r.getMessage() for r in ours if "never retrieved" in r.getMessage()]


def _raised(failure: BaseException, exc: BaseException | None) -> bool:
    """Whether ``exc`` is ``failure`` or was raised from it (its cause or context)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if exc is failure:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def test_prompt_longer_than_budget_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_trajectory_tokens"):
        run([["<answer> a </answer>"]], cfg=config(max_trajectory_tokens=16))


def test_tool_calls_protocol_produces_the_same_record() -> None:
    tok = tiny_tokenizer()
    protocol = ToolCallsProtocol(tok)
    s = protocol.assistant_turn_text(think="look it up", query="old book author")
    a = protocol.assistant_turn_text(answer="Alice")
    (group,), model, search, _ = run(
        [[s, a], [protocol.assistant_turn_text(answer="Bob")]], protocol=protocol
    )
    t = group[0]
    prompt = protocol.initial_prompt_tokens(Q)
    obs = observation(protocol, "old book author", s)
    assert tok.decode(obs, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user\n")
    assert t.tokens == tuple(prompt + enc(s) + obs + enc(a))
    assert (t.end_reason, t.final_answer, t.search_calls, t.format_ok) == (
        "answered",
        "Alice",
        1,
        True,  # the tool_calls protocol's verdict: one Answer: line
    )
    assert search.queries == ["old book author"]
    assert t.tokens[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the model closed its turn
    assert_consistent(t)


def test_sampling_params_follow_config_and_protocol() -> None:
    tok = tiny_tokenizer()
    cfg = Config().replace(model={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 99})
    p = sampling_params(cfg, TagsProtocol(tok))
    assert (p.temperature, p.top_p, p.max_tokens) == (0.7, 0.9, 99)
    assert p.stop_strings == ("</search>", "</answer>")
    assert tok.convert_tokens_to_ids("<|im_end|>") in p.stop_token_ids
    g = sampling_params(cfg, ToolCallsProtocol(tok), greedy=True)
    assert (g.temperature, g.top_p, g.stop_strings) == (0.0, 1.0, ("</tool_call>",))
