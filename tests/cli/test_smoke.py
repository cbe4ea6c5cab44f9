"""``searchr1 smoke``: the reference setup's output shape, the trajectory dump, and its diagnoses.

The scripted model (``tests/conftest.py``) makes rewards and search counts exact; one test
runs the real tiny model (``builtin:tiny-random``) with the offline BM25 search; a loopback
Zhihu fake plays a service that answers 429 (or 401) to every key.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from search_fakes import Behaviour, start_fake_zhihu
from smoke_configs import (
    TRAJECTORY_LINE,
    local_search,
    scripted,
    smoke,
    write_config,
)

from searchr1.core.answers import exact_match
from searchr1.kit.protocols.tags import TagsProtocol

#: the reference setup's example output: rewards 1.0 / 0.0 / -0.1 / 1.0, searches 2 / 3 / 4 / 2, final
#: answers France / Paris / None / France (trajectory 2 asks a fifth search and is stopped)
SCRIPTS = [
    ["<search> little prince author </search>", "<search> Saint-Exupéry born </search>",
     "<answer> France </answer>"],
    ["<search> Little Prince writer </search>", "<search> Saint-Exupéry </search>",
     "<search> Saint-Exupéry birthplace </search>", "<answer> Paris </answer>"],
    ["<search> who wrote it </search>", "<search> a </search>", "<search> b </search>",
     "<search> c </search>", "<search> d </search>"],
    ["<search> Le Petit Prince </search>", "<search> Saint-Exupéry Lyon </search>",
     "<answer> France </answer>"],
]  # fmt: skip
SEED_LINES = [
    ("0", "1.0", "2", "France"),
    ("1", "0.0", "3", "Paris"),
    ("2", "-0.1", "4", "None"),
    ("3", "1.0", "2", "France"),
]


def test_smoke_prints_the_seed_output_and_writes_trajectories(tmp_path, run_cli, scripted_plugin):
    config = write_config(tmp_path, scripted(SCRIPTS), local_search(tmp_path))
    code, out = smoke(run_cli, config)
    assert code == 0, out
    assert "search keys: 0" in out and "search probe: ok (2 results)" in out
    assert TRAJECTORY_LINE.findall(out) == SEED_LINES
    assert "search success rate: 100.00%" in out and "search error rate: 0.00%" in out
    assert "verdict: rewards of both signs: ok (2 positive, 1 negative of 4)" in out
    assert "verdict: searches within 1..4: ok" in out
    assert "verdict: answers in the tags format" in out and "search success >= 90%: ok" in out
    assert re.search(r"^smoke: PASS", out, re.M)
    # the group was sampled once with num_samples = 4, then one sample per later turn
    (model,) = scripted_plugin.created
    assert [c.num_samples for c in model.calls][0] == 4
    assert all(c.num_samples == 1 for c in model.calls[1:])
    records = [json.loads(line) for line in (tmp_path / "run" / "smoke_trajectories.jsonl").open()]
    assert [r["reward"] for r in records] == [1.0, 0.0, -0.1, 1.0]
    first = records[0]
    assert first["question"] == "Who is the author of The Little Prince and where was he born?"
    assert first["turns"][0]["query"] == "little prince author"
    assert "France" in first["golden_answers"] and "Paris" not in first["golden_answers"]
    assert "Doc 1(Title: The Little Prince)" in first["turns"][0]["observation_text"]
    assert first["prompt_text"].endswith("<|im_start|>assistant\n")
    assert len(first["tokens"]) == len(first["generated_mask"]) == len(first["logprobs"])


def test_smoke_options_question_answers_group_and_search_limit(tmp_path, run_cli, scripted_plugin):
    turns = [["<search> a </search>", "<search> b </search>", "<answer> Lyon </answer>"],
             ["<answer> Paris </answer>"]]  # fmt: skip
    config = write_config(tmp_path, scripted(turns), local_search(tmp_path))
    code, out = smoke(
        run_cli, config, "--question", "Where was he born?", "--answer", "Lyon",
        "--answer", "Lyon, France", "--group-size", "2", "--max-search-calls", "1",
    )  # fmt: skip
    assert code == 3, out  # channels fine; no positive reward and trajectory 1 never searched
    assert TRAJECTORY_LINE.findall(out) == [("0", "-0.1", "1", "None"), ("1", "0.0", "0", "Paris")]
    assert "verdict: rewards of both signs: FAILED (0 positive, 1 negative of 2" in out
    assert "verdict: searches within 1..1: FAILED (trajectories 1 (0) searched outside" in out
    assert "smoke: FAILED: rewards of both signs; searches within 1..1" in out
    record = json.loads((tmp_path / "run" / "smoke_trajectories.jsonl").read_text().splitlines()[0])
    assert record["end_reason"] == "search_limit" and record["golden_answers"] == [
        "Lyon",
        "Lyon, France",
    ]


def test_report_only_criteria_are_printed_but_do_not_fail_the_smoke(
    tmp_path, run_cli, scripted_plugin
):
    """An untrained model's config lists the behaviour it cannot show yet in [smoke]
    report_only: the verdict still prints it, the exit code ignores it; the answer format
    (not listed) still fails the smoke."""
    turns = [["<answer> France </answer>"], ["<search> a </search>", "<answer> France </answer>"]]
    config = write_config(tmp_path, scripted(turns), local_search(tmp_path))
    base = config.read_text()
    config.write_text(base + '[smoke]\nreport_only = ["both_signs", "searches_in_range"]\n')
    code, out = smoke(run_cli, config, "--group-size", "2")
    assert code == 0, out
    assert "verdict: rewards of both signs: not met, reported only (2 positive, 0 negative" in out
    assert "verdict: searches within 1..4: not met, reported only (trajectories 0 (0)" in out
    assert "smoke: PASS (the rollout chain works; not required by [smoke] report_only: " in out

    config.write_text(
        base.replace('"<answer> France </answer>"', '"France"')
        + '[smoke]\nreport_only = ["both_signs", "searches_in_range"]\n'
    )
    code, out = smoke(run_cli, config, "--group-size", "2")
    assert code == 3, out
    assert "smoke: FAILED: answers in the tags format" in out


def test_an_unknown_report_only_criterion_names_the_field(config_file, run_cli):
    config = config_file('[smoke]\nreport_only = ["search_success"]\n')
    check = run_cli("config", "check", "--config", config)
    err = check.err
    assert check.code == 2
    assert "smoke.report_only" in err and "'search_success'" in err and "'both_signs'" in err


def test_all_rewards_negative_is_diagnosed_as_missing_answer_format(
    tmp_path, run_cli, scripted_plugin
):
    config = write_config(
        tmp_path, scripted([["no idea"], ["still no idea"]]), local_search(tmp_path)
    )
    code, out = smoke(run_cli, config, "--group-size", "2")
    assert code == 3  # the channels work, but the reference setup's criteria are not met
    assert (
        "verdict: answers in the tags format (one <answer>...</answer> element): FAILED "
        "(0 of 2 answered in the format; the model never wrote it (end reasons: invalid_action))"
    ) in out
    assert "smoke: FAILED: rewards of both signs; searches within 1..4; answers in" in out


def test_quota_exhausted_on_every_key_exits_non_zero(tmp_path, run_cli, scripted_plugin):
    with start_fake_zhihu(Behaviour(all_status=429)) as (base_url, server):
        search = (
            f'[search]\nprovider = "zhihu"\napi_keys = "k-one,k-two"\napi_base = "{base_url}"\n'
        )
        config = write_config(tmp_path, scripted(SCRIPTS), search)
        code, out = smoke(run_cli, config)
        assert server.records and all(r.status == 429 for r in server.records)
    assert code == 1, out
    assert "search keys: 2" in out and "search probe: FAILED (quota exhausted (429))" in out
    assert (
        "every search key is limited or rejected (key 0 (quota exhausted (429)), "
        "key 1 (quota exhausted (429)))"
    ) in out
    assert "verdict: search success >= 90%: FAILED (0.00%" in out
    assert "search success rate: 0.00%" in out
    assert "k-one" not in out and "k-two" not in out  # keys never printed
    # the failed searches were observations, not crashes
    records = [json.loads(line) for line in (tmp_path / "run" / "smoke_trajectories.jsonl").open()]
    assert records[0]["turns"][0]["observation_text"].count("search failed") == 1


def test_one_key_out_of_quota_while_the_others_serve_is_a_warning(
    tmp_path, run_cli, scripted_plugin
):
    """The reference setup's rule: rotate keys; only all keys limited stops the run."""
    with start_fake_zhihu(Behaviour(key_status={"k-two": 429})) as (base_url, server):
        search = (
            f'[search]\nprovider = "zhihu"\napi_keys = "k-one,k-two,k-three"\n'
            f'api_base = "{base_url}"\ntop_k = 1\n'
        )
        code, out = smoke(run_cli, write_config(tmp_path, scripted(SCRIPTS), search))
        assert set(server.keys_served(429)) == {"k-two"}  # concurrent requests may both hit it
    assert code == 0, out
    assert TRAJECTORY_LINE.findall(out) == SEED_LINES
    assert (
        "warning: 1 of 3 search keys benched (key 1 (quota exhausted (429))); the other 2 "
        "served the searches"
    ) in out
    assert "search success rate: 100.00%" in out and "smoke: PASS" in out
    assert "k-two" not in out


def test_rejected_key_is_diagnosed_as_401(tmp_path, run_cli, scripted_plugin):
    with start_fake_zhihu(Behaviour(all_status=401)) as (base_url, _):
        search = f'[search]\nprovider = "zhihu"\napi_keys = "bad-key"\napi_base = "{base_url}"\n'
        code, out = smoke(run_cli, write_config(tmp_path, scripted(SCRIPTS), search))
    assert code == 1
    assert "401/403: the search service rejected" in out and "bad-key" not in out


def test_missing_key_variable_is_named(tmp_path, run_cli, monkeypatch, scripted_plugin):
    monkeypatch.delenv("SMOKE_TEST_MISSING_KEYS", raising=False)
    search = '[search]\nprovider = "zhihu"\napi_keys = "${SMOKE_TEST_MISSING_KEYS}"\n'
    config = write_config(tmp_path, scripted(SCRIPTS), search)
    result = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 2
    assert "SMOKE_TEST_MISSING_KEYS, which is not set" in result.err


def test_model_channel_failure_exits_non_zero(tmp_path, run_cli, scripted_plugin):
    """A failure of no known class is not diagnosed from its text: "401" in a message is not
    a rejected key (tests/remote/test_remote_failures.py has the real ones)."""
    config = write_config(
        tmp_path, scripted(SCRIPTS, fail="HTTP 401 Unauthorized"), local_search(tmp_path)
    )
    code, out = smoke(run_cli, config)
    assert code == 1
    assert "the model channel failed: RuntimeError: HTTP 401 Unauthorized" in out
    assert "api_key" not in out and "can reach its service or files" in out


def test_prompt_longer_than_the_trajectory_budget_is_a_config_error(
    tmp_path, run_cli, scripted_plugin
):
    """The config, not the model channel, is at fault: exit 2 naming the field, no
    traceback, and no "model channel failed" diagnosis."""
    config = write_config(tmp_path, scripted(SCRIPTS), local_search(tmp_path))
    text = config.read_text(encoding="utf-8")
    text = text.replace("max_trajectory_tokens = 512", "max_trajectory_tokens = 16")
    config.write_text(text.replace("max_new_tokens = 64", "max_new_tokens = 8"), encoding="utf-8")
    result = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "run")
    code, out, err = result.code, result.err, result.err
    assert code == 2, out
    assert re.search(
        r"^searchr1: error: question 'smoke': the prompt alone has \d+ tokens, no room left in "
        r"rollout\.max_trajectory_tokens = 16$",
        err,
        re.M,
    ), err
    assert "Traceback" not in err and "model channel failed" not in out


def test_smoke_with_the_tiny_model_and_offline_search(tmp_path, run_cli):
    model = (
        '[model]\nprovider = "local"\nbase_model = "builtin:tiny-random"\nmax_new_tokens = 24\n'
        "temperature = 1.0\ntop_p = 1.0\n"
    )
    config = write_config(tmp_path, model, local_search(tmp_path))
    code, out = smoke(run_cli, config)
    assert code in (0, 3), out  # the channels work; a random model rarely meets the criteria
    assert re.search(r"^search keys: 0$", out, re.M)
    assert len(re.findall(r"^verdict: .*: (ok|FAILED) \(", out, re.M)) == 4
    assert ("smoke: PASS" in out) == (code == 0)
    lines = TRAJECTORY_LINE.findall(out)
    assert [n for n, *_ in lines] == ["0", "1", "2", "3"]
    assert re.search(r"^search success rate: \d+\.\d\d%$", out, re.M)
    assert re.search(r"^search error rate: \d+\.\d\d%$", out, re.M)
    records = [
        json.loads(r)
        for r in (tmp_path / "run" / "smoke_trajectories.jsonl").read_text().splitlines()
    ]
    assert len(records) == 4 and all(r["turns"] for r in records)
    # Each printed line is the reward table applied to what the model actually wrote,
    # recomputed here from the dumped text (the reference setup's -0.1 / 1.0 / 0.0), and the counts
    # and answer of that same trajectory.
    for (_, printed, calls, answer), record in zip(lines, records, strict=True):
        text = "\n".join(t["text"] for t in record["turns"])
        answers = TagsProtocol.extract_answers(text)
        final = record["final_answer"]
        well_formed = final is not None and final.strip() != "" and answers == [final.strip()]
        expected = 1.0 if exact_match(final, record["golden_answers"]) else 0.0
        expected = expected if well_formed else -0.1
        assert float(printed) == pytest.approx(expected) == record["reward"], record
        searched = sum(t["action"] == "search" for t in record["turns"])
        assert int(calls) == searched == record["search_calls"]
        assert answer == str(final)


def test_smoke_names_the_token_limit_that_cut_the_turns(tmp_path, run_cli, scripted_plugin):
    """A search call longer than max_new_tokens is cut before </search> and reads as an
    invalid action; a trajectory whose observation fills max_trajectory_tokens ends at the
    token limit. The verdict names both settings with the counts instead of only "the model
    never wrote it"."""
    long_call = "<search> " + "where was the author of the little prince born " * 3 + "</search>"
    turns = [[long_call], [long_call], ["<search> Lyon </search>", "<answer> France </answer>"]]
    model = scripted(turns).replace("max_new_tokens = 64", "max_new_tokens = 40")
    config = write_config(tmp_path, model, local_search(tmp_path))
    text = config.read_text().replace("max_trajectory_tokens = 512", "max_trajectory_tokens = 200")
    config.write_text(text)
    code, out = smoke(run_cli, config, "--group-size", "3")
    assert code == 3, out
    assert (
        "token limit: 2 of 3 turns ended at model.max_new_tokens = 40 before the protocol's "
        "closing tag (stop reason 'length'): the action was cut off and read as invalid; "
        "raise model.max_new_tokens"
    ) in out
    assert "token limit: 1 of 3 trajectories ran out of rollout.max_trajectory_tokens = 200" in out


def test_the_offline_demo_smoke_asks_a_question_of_its_own_world(tmp_path, run_cli, monkeypatch):
    """No config: the embedded offline demo. Its [smoke] question is one of the generated
    world's, so the demo model can find the answer (the reference setup's Little Prince question has none
    in a fictional corpus); --question/--answer still win."""
    monkeypatch.chdir(tmp_path)  # no ./config.toml here: the embedded default
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    result = run_cli("smoke", "--run-dir", tmp_path / "run")
    code, out = result.code, result.err  # smoke's report (stdout: JSON events)
    assert "Question: Who founded Nungen Guild?" in out and "Little Prince" not in out
    assert code == 0, out  # a newcomer's first command passes
    assert "smoke: PASS" in out and "verdict: search success >= 90%: ok" in out
    rewards = [float(r) for _, r, _, _ in TRAJECTORY_LINE.findall(out)]
    assert len(rewards) == 4 and max(rewards) == 1.0, out  # the answer is in its world
    out = run_cli("smoke", "--run-dir", tmp_path / "run2", "--question", "Who founded Redel Guild?",
                  "--answer", "Telin Minpin", "--group-size", "2").err  # fmt: skip
    assert "Question: Who founded Redel Guild?" in out and "Nungen" not in out


def test_a_smoke_question_needs_its_answers(config_file, run_cli):
    config = config_file('[smoke]\nquestion = "Who founded Nungen Guild?"\n')
    check = run_cli("config", "check", "--config", config)
    err = check.err
    assert check.code == 2
    assert "smoke.question is set but smoke.answers is empty" in err


#: every hook's example in docs/plugins.md, as the module a plugin author saves it in
DOCS_MODULES = {
    "doc_search": "register_search_providers",
    "doc_reward": "register_rewards",
    "doc_loss": "register_loss_fns",
    "doc_model": "register_model_providers",
    "doc_sink": "register_metric_sinks",
    "doc_protocol": "register_agent_protocols",
    "doc_asset": "register_assets",
}
DOCS_EXAMPLES_CONFIG = """\
[rollout]
protocol = "final_line"
max_trajectory_tokens = 512
[search]
provider = "echo"
[reward]
terms = ["no_repeat"]
[train]
loss_fn = "reinforce"
max_datum_tokens = 512
[log]
sinks = ["scalars_file"]
[data]
train = "builtin:quiz/quiz.jsonl"
"""


def test_every_docs_plugin_example_runs_the_development_loop_through_smoke(
    tmp_path, run_cli, scripted_plugin, monkeypatch
):
    """docs/plugins.md's examples copied word for word into modules, loaded as the docs'
    development loop says ($SEARCHR1_PLUGINS): ``plugins`` lists them, ``config check`` passes
    a config choosing them (the quiz asset built as the training file), and ``smoke`` passes
    with the echo search (no ``calls`` metric), the final_line protocol (answers on a
    ``FINAL:`` line) and the no_repeat shaping term added to the default reward (trajectory 0
    repeats its query: 1.0 - 0.5). The model provider example is a sketch (``MyProvider`` is
    the author's own) and the scripted model stands in; the loss and the sink are chosen and
    checked by name (smoke trains nothing and opens no sink)."""
    from cli_run import docs_example

    for module, hook in DOCS_MODULES.items():
        (tmp_path / f"{module}.py").write_text(docs_example(hook), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the docs' modules next to the scripted model's (the scripted_plugin fixture's)
    monkeypatch.setenv("SEARCHR1_PLUGINS", ",".join([*DOCS_MODULES, "scripted_plugin"]))
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
    for module in DOCS_MODULES:
        monkeypatch.delitem(sys.modules, module, raising=False)  # imported afresh, dropped after
    scripts = [[turn.replace("<answer>", "FINAL:").replace(" </answer>", "") for turn in t]
               for t in [[SCRIPTS[0][0], *SCRIPTS[0][::2]], *SCRIPTS[1:]]]  # fmt: skip
    assert scripts[0] == ["<search> little prince author </search>"] * 2 + ["FINAL: France"]
    config = tmp_path / "config.toml"
    config.write_text(f"{scripted(scripts)}\n{DOCS_EXAMPLES_CONFIG}", encoding="utf-8")
    try:
        listed = run_cli("plugins").out
        check = run_cli("config", "check", "--plugins", "--config", config)
        code, out = smoke(run_cli, config)
    finally:
        for module in DOCS_MODULES:
            sys.modules.pop(module, None)

    for name in ("echo", "no_repeat", "reinforce", "my_service", "scalars_file", "final_line",
                 "marker_tool_calls", "quiz"):  # fmt: skip
        assert re.search(rf"^  {name} +from plugin doc_\w+ \(development", listed, re.M), name
    assert "with defaults: searchr1 config check --plugins" in listed
    assert check.code == 0, check.err
    assert "train would stop" not in check.out + check.err
    assert "# search provider 'echo' (plugin doc_search, development): declares no settings" in (
        check.out
    )
    assert code == 0, out
    assert [r for _, r, _, _ in TRAJECTORY_LINE.findall(out)] == ["0.5", "0.0", "-0.1", "1.0"]
    assert "verdict: answers in the final_line format (one `FINAL: <answer>` line): ok" in out
    assert "search success >= 90%: ok (100.00%)" in out and "smoke: PASS" in out
    first = json.loads((tmp_path / "run" / "smoke_trajectories.jsonl").open().readline())
    assert first["components"]["no_repeat"] == -0.5 and first["components"]["correct"] == 1.0
