"""``searchr1 eval``: scores per source, search-failure flagging, determinism, checkpoints.

The metric test drives the real rollout, the real ``local`` BM25 search over a corpus written
here, the real ``format_answer`` reward and the real tags protocol with a scripted policy (a
model provider whose turns are known), so every expected number is computed by hand. The
CLI tests run the real ``builtin:tiny-random`` model end to end.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from cli_run import read_events
from eval_world import QUESTIONS, write_world

from searchr1.cli.main import main as cli_main
from searchr1.core.config import load_config
from searchr1.core.data import load_questions
from searchr1.core.evaluation import evaluate, format_comparison, format_table, trust_warning
from searchr1.core.plugins import load_registry
from searchr1.core.protocols import make_protocol
from searchr1.core.types import SampledSequence, SamplingParams, SearchResponse


class ScriptedPolicy:
    """A model provider that plays a fixed script per question through the real protocol:
    search for the question then answer, answer at once, or ramble without an answer."""

    def __init__(self, protocol_factory, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self._tokenizer = tokenizer
        self.protocol = protocol_factory(tokenizer)

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self._tokenizer

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        assert params.temperature == 0.0  # eval is greedy by default
        text = self.protocol.decode(prompt_tokens)
        _, _, question, _, (kind, answer) = next(q for q in QUESTIONS if q[2] in text)
        if kind == "ramble":
            tokens = self.protocol.encode("I am not sure about this one.")
        elif kind == "search" and "<information>" not in text.split(question)[-1]:
            tokens = self.protocol.assistant_turn_tokens(think="look it up", query=question)
        else:
            tokens = self.protocol.assistant_turn_tokens(answer=answer)
        seq = SampledSequence(tuple(tokens), (0.0,) * len(tokens), "stop")
        return [seq] * num_samples

    def close(self) -> None:
        pass


class FailingOn:
    """The real search provider, except that queries containing ``word`` time out."""

    def __init__(self, inner, word: str) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.word = inner, word

    async def search(self, query: str, top_k: int) -> SearchResponse:
        if self.word in query:
            return SearchResponse(error="timeout")
        return await self.inner.search(query, top_k)

    def metrics(self, reset: bool = False) -> dict[str, float]:
        return self.inner.metrics(reset)

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_world(tmp_path_factory.mktemp("world"))


def test_scores_per_source_and_search_flag(world: Path) -> None:
    from transformers import AutoTokenizer

    from searchr1.core.assets import resolve

    config = load_config(world, registry=load_registry())
    registry = load_registry()
    tokenizer = AutoTokenizer.from_pretrained(resolve("builtin:tiny-random", config.assets))
    protocol = make_protocol(config, tokenizer, load_registry())
    model = ScriptedPolicy(lambda tok: make_protocol(config, tok, load_registry()), tokenizer)
    search = FailingOn(registry.create("search_provider", "local", config), "mayor")
    reward = registry.create("reward", "format_answer", config)
    questions = load_questions(config.data.eval, config.assets).questions

    result = asyncio.run(
        evaluate(model, search, protocol, reward, questions, config, label="scripted")  # type: ignore[arg-type]
    )
    m = result.metrics

    nq, hotpot = m["per_source"]["nq"], m["per_source"]["hotpotqa"]
    assert (nq["n"], hotpot["n"]) == (2, 3)
    assert nq["em"] == 0.5 and math.isclose(hotpot["em"], 2 / 3)
    assert math.isclose(m["macro_em"], (0.5 + 2 / 3) / 2)
    assert m["micro_em"] == m["em"] == 3 / 5
    # "Orlin" against "Orlin River": half the tokens -> F1 2/3 for question b
    assert math.isclose(nq["f1"], (1 + 2 / 3) / 2)
    assert hotpot["format_rate"] == pytest.approx(2 / 3) and nq["format_rate"] == 1.0
    assert nq["search_calls_mean"] == 0.5 and hotpot["search_calls_mean"] == pytest.approx(2 / 3)
    # three searches, the "mayor" one failed: 2/3 success is under 90% -> not trustworthy
    assert (m["search_calls"], m["search_errors"]) == (3, 1)
    assert m["search_success_rate"] == pytest.approx(2 / 3) and m["trustworthy"] is False
    assert hotpot["search_success_rate"] == 0.5 and nq["search_success_rate"] == 1.0
    assert "NOT trustworthy" in trust_warning(result)[0]

    # per-question records keep the whole trajectory, in file order
    records = [r.to_dict() for r in result.records]
    assert [r["question_id"] for r in records] == [
        "nq/a",
        "nq/b",
        "hotpotqa/c",
        "hotpotqa/d",
        "hotpotqa/e",
    ]
    first = records[0]
    assert first["em"] == 1.0 and first["final_answer"] == "Ada Quill"
    assert first["turns"][0]["action"] == "search"
    assert "Ada Quill" in first["turns"][0]["observation_text"]  # the real BM25 hit
    assert records[2]["turns"][0]["search_error"] == "timeout"
    assert records[3]["end_reason"] == "invalid_action" and records[3]["format_ok"] is False

    table = format_table(result)
    assert "hotpotqa" in table and " 66.7" in table and "macro EM" in table
    comparison = format_comparison([result, result])
    assert comparison.count("scripted") == 2 and "macro EM" in comparison


def _eval_cli(config: Path, run_dir: Path, *extra: str) -> dict:
    assert cli_main(["eval", "--config", str(config), "--run-dir", str(run_dir), *extra]) == 0
    return json.loads((run_dir / "eval_summary.json").read_text())


@pytest.mark.slow
def test_cli_tiny_random_is_deterministic_and_compares_checkpoints(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two checkpoints in the train loop's layout, written by the real local provider, each
    # with its own non-zero adapter (B = 0 would equal the base model by construction, and
    # a checkpoint that was never loaded would pass).
    import torch

    config = load_config(world, registry=load_registry())
    for run, step, seed in (("run-a", 3, 1), ("run-b", 5, 2)):
        model = load_registry().create("model_provider", "local", config).trainer
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=gen))
        ckpt = tmp_path / run / "checkpoints" / f"step_{step:06d}"
        model.save_state(str(ckpt / "model"))
        (ckpt / "trainer.json").write_text(json.dumps({"step": step}))
        model.close()

    # Sampled rather than greedy: greedy decoding of random weights repeats one token, while
    # seeded sampling gives varied text, a stronger check that nothing else leaks in.
    args = (
        "--checkpoint",
        "base",
        "--checkpoint",
        str(tmp_path / "run-a"),
        "--checkpoint",
        str(tmp_path / "run-b"),
        "--limit-per-source",
        "2",
        "--sample",
    )
    first = _eval_cli(world, tmp_path / "e1", *args)
    out = capsys.readouterr().err  # eval's tables (stdout: JSON events)
    second = _eval_cli(world, tmp_path / "e2", *args)

    assert first["results"] == second["results"]  # identical numbers twice in a row
    assert list(first["results"]) == ["base", "step_3", "step_5"]
    assert first["questions"] == 4  # 2 nq + 2 of the 3 hotpotqa
    texts = {}
    for label in ("base", "step_3", "step_5"):
        a = (tmp_path / "e1" / f"eval_{label}.jsonl").read_text()
        assert a == (tmp_path / "e2" / f"eval_{label}.jsonl").read_text()
        assert len(a.splitlines()) == 4
        texts[label] = [[t["text"] for t in r["turns"]] for r in map(json.loads, a.splitlines())]
        assert len({t for turns in texts[label] for t in turns}) > 1
    # Each checkpoint's adapter was loaded: same seeds, three different policies' text.
    assert texts["base"] != texts["step_3"] != texts["step_5"] != texts["base"]
    assert "== base" in out and "== step_3" in out and "== step_5" in out and "macro EM" in out
    events = read_events(tmp_path / "e1")
    results = [e for e in events if e["event"] == "eval_result"]
    assert [e["label"] for e in results] == ["base", "step_3", "step_5"]


def test_scores_with_search_down_are_written_and_exit_3(tmp_path: Path, run_cli) -> None:
    """Every search refused (a closed loopback port): the tables, records and summary are
    written, the warning says the scores are not trustworthy, and the exit is 3, so
    ``searchr1 eval && publish`` does not go on with them."""
    from cli_run import make_config, write_config
    from offline import closed_port

    search = {"provider": "search_r1", "api_base": f"http://127.0.0.1:{closed_port()}"}
    search["local"] = None
    text = make_config(
        search={**search, "max_retries": 0}, data={"eval": "builtin:world/heldout.jsonl"}
    )
    config = write_config(tmp_path, text)
    result = run_cli(
        "eval", "--config", config, "--run-dir", tmp_path / "e", "--limit-per-source", "2"
    )
    assert result.code == 3, result.err
    assert "NOT trustworthy" in result.err
    assert "search failed too often for the scores of base to mean anything" in result.err
    summary = json.loads((tmp_path / "e" / "eval_summary.json").read_text())
    assert summary["results"]["base"]["trustworthy"] is False
    failed = read_events(tmp_path / "e", "search_failed")
    assert failed and failed[0]["failure"] == "refused"


def test_questions_too_long_for_the_token_limit_are_refused_before_any_rollout(
    world: Path, tmp_path: Path, run_cli
) -> None:
    """A rollout stops on such a question, part-way through an eval; all of them are found
    first, the first one named and the rest counted, and no records are written."""
    rows = [json.loads(line) for line in (world.parent / "heldout.jsonl").read_text().splitlines()]
    for i in (1, 2, 3):
        rows[i] = {**rows[i], "id": f"long{i}", "question": "Who? " + "lorem " * 600}
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("eval", "--config", world, "--run-dir", tmp_path / "r", "--data", data)
    assert result.code == 2, result.err
    assert f"--data = '{data}': question 'nq/long1': the prompt alone has " in result.err
    assert "(and 2 more questions); raise rollout.max_trajectory_tokens, or leave them out" in (
        result.err
    )
    assert not list((tmp_path / "r").glob("eval_*.jsonl"))
    assert not read_events(tmp_path / "r", "eval_start")


def test_cli_errors_are_plain_messages(world: Path, tmp_path: Path, run_cli) -> None:
    base = ["eval", "--config", world, "--run-dir", tmp_path / "r"]
    for extra, message in (
        (["--data", tmp_path / "missing.jsonl"], "--data = "),
        (["--checkpoint", tmp_path / "nope"], "not a folder"),
        (["--limit-per-source", "0"], "--limit-per-source must be >= 1"),
    ):
        result = run_cli(*base, *extra)
        assert result.code == 2 and message in result.err, result


def test_hosted_model_eval_over_loopback_chat_server(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[model] provider = "openai_chat"`` against a loopback chat-completions server that
    answers with a real tool call, then a final ``Answer:`` line; search is the real BM25."""
    from fake_chat_server import API_KEY, FakeChatServer

    (tmp_path / "one.jsonl").write_text(
        json.dumps(
            {
                "id": "a",
                "question": "Who founded Velmora?",
                "golden_answers": ["Ada Quill"],
                "data_source": "nq",
            }
        )
        + "\n"
    )
    text = world.read_text().replace(
        'provider = "local"\nbase_model', 'provider = "openai_chat"\nbase_model', 1
    )
    with FakeChatServer() as server:
        text = text.replace(
            "[model]\n", f'[model]\napi_base = "{server.base_url}"\napi_key = "{API_KEY}"\n'
        )
        text = text.replace('protocol = "tags"', 'protocol = "tool_calls"')
        # the chat template's tool block makes a longer prompt than the tags protocol
        text = text.replace("max_trajectory_tokens = 320", "max_trajectory_tokens = 1200")
        text = text.replace("max_datum_tokens = 512", "max_datum_tokens = 1200")
        text = text.replace("max_new_tokens = 16", "max_new_tokens = 64")
        config = tmp_path / "hosted.toml"
        config.write_text(text)
        server.reply(tool_calls=[{"name": "search", "arguments": {"query": "Velmora founder"}}])
        server.reply(content="Velmora was founded by Ada Quill.\nAnswer: Ada Quill")
        summary = _eval_cli(config, tmp_path / "hosted", "--data", str(tmp_path / "one.jsonl"))

    base = summary["results"]["base"]
    assert (base["em"], base["format_rate"], base["search_calls"], base["search_success_rate"]) == (
        1.0,
        1.0,
        1,
        1.0,
    )
    # the second request carried the real search result back as a tool message
    tool_messages = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 1 and "Ada Quill" in tool_messages[0]["content"]
    assert server.requests[0]["temperature"] == 0.0  # greedy
    (record,) = map(json.loads, (tmp_path / "hosted" / "eval_base.jsonl").read_text().splitlines())
    assert (
        record["turns"][0]["query"] == "Velmora founder" and record["final_answer"] == "Ada Quill"
    )
    assert API_KEY not in (tmp_path / "hosted" / "events.jsonl").read_text()
    printed = capsys.readouterr()
    assert API_KEY not in printed.out + printed.err


@pytest.mark.slow
def test_checkpoint_is_evaluated_with_its_saved_config(
    tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline demo's tiny model trained two steps, then evaluated where ./config.toml
    names another base model of the same shape and another LoRA rank: without --config the
    checkpoint's own settings are used (the same records as the training config gives); with
    another config given, each differing field is warned about."""
    from cli_run import make_config, write_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    trained = write_config(tmp_path, make_config(), "train.toml")
    other = write_config(
        tmp_path, make_config(model={"base_model": "builtin:tiny-random"}), "other.toml"
    )
    write_config(  # ./config.toml: its LoRA would not fit the checkpoint's adapter
        tmp_path, make_config(model={"base_model": "builtin:tiny-random"}, lora={"rank": 8})
    )
    assert run_cli("train", "--config", trained, "--run-dir", "run").code == 0
    ask = ("--checkpoint", "run", "--data", "builtin:world/train.jsonl", "--limit-per-source", "2")

    saved = run_cli("eval", *ask, "--run-dir", "e-saved")
    given = run_cli("eval", *ask, "--config", other, "--run-dir", "e-other")
    same = run_cli("eval", *ask, "--config", trained, "--run-dir", "e-same")

    assert saved.code == given.code == same.code == 0, (saved.err, given.err, same.err)
    assert "config: config.toml (./config.toml exists" in saved.err  # the default it replaced
    checkpoint_config = Path("run/checkpoints/step_000002/config.toml")
    assert (
        f"eval: the settings the checkpoint was trained with, from {checkpoint_config} "
        "([run], [data], [log] from config.toml" in saved.err
    )
    assert "differs" not in saved.err + same.err
    warnings = [line for line in given.err.splitlines() if "differs" in line]
    assert warnings == [
        "searchr1: warning: eval: --config differs from the checkpoint's config at "
        "model.base_model: 'builtin:tiny-random' (--config) vs 'builtin:tiny' (checkpoint)"
    ]
    records = {
        name: (tmp_path / name / "eval_step_2.jsonl").read_text()
        for name in ("e-saved", "e-other", "e-same")
    }
    assert records["e-saved"] == records["e-same"] != records["e-other"]
