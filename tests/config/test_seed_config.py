"""The reference setup's config, copied verbatim, does what the reference setup says.

``tests/fixtures/seed_config.toml`` is the reference setup's section 3 skeleton. Each test copies it as
``config.toml`` into an empty project folder with the reference setup's ``.env`` (section 4, step 1) and
runs what a user following the reference setup runs, against loopback fakes: the PyTRIO service
(``fake_pytrio_service.py``, the real ``pytrio`` SDK over HTTP) and the Zhihu search API
(``search_fakes.py``). What the tests must change is only where the services live: the
skeleton's ``https://taotoken.net/api`` and Zhihu's default URL become the fakes' loopback
URLs, and the ``Qwen/Qwen3.5-4B`` tokenizer (no hub access in tests) is the tiny model's, set in
``[model.taotoken] tokenizer``. The policy behind the fake service is scripted
(``tests/fakes.ScriptedModel``) so that the group reproduces the reference setup's example output exactly:
rewards 1.0 / 0.0 / -0.1 / 1.0, searches 2 / 3 / 4 / 2, answers France / Paris / None / France.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from fake_pytrio_service import API_KEY, FakePyTrio
from fakes import ScriptedModel, tiny_tokenizer
from search_fakes import Behaviour, start_fake_zhihu

from searchr1.cli.main import main as cli
from searchr1.core.config import load_config
from searchr1.core.plugins import load_registry

FIXTURE = Path(__file__).parents[1] / "fixtures" / "seed_config.toml"
ZHIHU_KEYS = "key1,key2,key3"
SEED_ENV = f"TAOTOKEN_API_KEY={API_KEY}\nZHIHU_SEARCH_KEYS={ZHIHU_KEYS}\n"
SEED_LINES = [
    ("0", "1.0", "2", "France"),
    ("1", "0.0", "3", "Paris"),
    ("2", "-0.1", "4", "None"),
    ("3", "1.0", "2", "France"),
]
TRAJECTORY_LINE = re.compile(
    r"^trajectory (\d+): reward=(-?\d\.\d), search_calls=(\d+), final_answer=(.*)$", re.M
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder holding the verbatim skeleton and the reference setup's .env; the
    variables the .env fills are restored (absent) after the test."""
    monkeypatch.chdir(tmp_path)
    for var in ("TAOTOKEN_API_KEY", "ZHIHU_SEARCH_KEYS", "SEARCHR1_CONFIG"):
        monkeypatch.setenv(var, "x")  # records the original state for teardown...
        monkeypatch.delenv(var)  # ...then starts the test without it
    shutil.copy(FIXTURE, tmp_path / "config.toml")
    (tmp_path / ".env").write_text(SEED_ENV, encoding="utf-8")
    return tmp_path


def seed_policy(tokenizer) -> ScriptedModel:  # type: ignore[no-untyped-def]
    """The reference setup's example group, written in the tool_calls protocol's own turn format."""
    from searchr1.kit.protocols.tool_calls import ToolCallsProtocol

    p = ToolCallsProtocol(tokenizer)

    def q(text: str) -> list[int]:
        return p.assistant_turn_tokens(query=text)

    def a(text: str) -> list[int]:
        return p.assistant_turn_tokens(answer=text)

    return ScriptedModel(
        tokenizer,
        [
            [q("The Little Prince author"), q("Saint-Exupéry birthplace"), a("France")],
            [q("Little Prince writer"), q("Saint-Exupéry"), q("Saint-Exupéry born"), a("Paris")],
            [q("who wrote it"), q("a"), q("b"), q("c"), q("d")],  # a 5th search: stopped
            [q("Le Petit Prince"), q("Saint-Exupéry Lyon"), a("France")],
        ],
    )


def point_at_fakes(config, tmp_path: Path, model_url: str, search_url: str):  # type: ignore[no-untyped-def]
    """The loaded verbatim config with only the services' addresses and the tokenizer
    changed (see the module docstring)."""
    tok_dir = tmp_path / "tokenizer"
    if not tok_dir.exists():
        tiny_tokenizer().save_pretrained(tok_dir)
    config = config.replace(model={"api_base": model_url}, search={"api_base": search_url})
    table = {"tokenizer": str(tok_dir), "sdk_home": str(tmp_path / "home")}
    table["retry_timeout_seconds"] = 5.0  # type: ignore[assignment]
    return dataclasses.replace(config, plugins={**config.plugins, "model.taotoken": table})


def smoke_args(run_dir: Path) -> argparse.Namespace:
    return argparse.Namespace(
        config=None, run_dir=str(run_dir), resume=False, max_steps=None,
        question=None, answer=None, group_size=4, max_search_calls=4,
    )  # fmt: skip


# --------------------------------------------------------------------------- items 1, 2, 4


def test_verbatim_skeleton_selects_taotoken_and_the_answer_line(project: Path, capsys) -> None:
    assert cli(["config", "check"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    # item 4: ./config.toml runs without --config, and the first line says so; the skeleton
    # has no [data] train, which config check says before train would stop
    assert lines[0] == (
        "# config.toml: OK for smoke and eval; 1 warning says train would stop here (secrets "
        "redacted); chosen: ./config.toml exists in the working directory; no --config given"
    )
    assert "data.train is empty: train would stop here" in err
    assert "searchr1 data get nq-hotpotqa" in err
    # item 1: the provider and protocol the reference setup describes, each with its reason
    assert (
        "# model.provider = 'taotoken': not set; [model] sets api_base and api_key and no "
        "provider: sampling and training go through the TaoToken service (the reference setup)"
    ) in lines
    assert any(
        line.startswith("# rollout.protocol = 'tool_calls': not set;") and "`Answer: ...`" in line
        for line in lines
    )
    assert 'provider = "taotoken"' in out and 'protocol = "tool_calls"' in out
    # a remote service: pipelined steps unless the file says otherwise
    assert any(
        line.startswith("# train.max_staleness = 1: not set; 1 for provider 'taotoken'")
        for line in lines
    ), out
    assert "max_staleness = 1" in out
    # item 2: what TaoToken cannot honour, named with what happens instead
    warnings = [line for line in lines if line.startswith("# warning: ")]
    assert any("lora.alpha = 64 is not sent to provider 'taotoken'" in w for w in warnings)
    assert any("lora.dropout = 0.05 is not sent to provider 'taotoken'" in w for w in warnings)
    temperature = [w for w in warnings if w.startswith("# warning: model.temperature = 0.8")]
    assert temperature and "importance ratio" in temperature[0]
    assert "temperature = 1.0" not in temperature[0]  # the reference setup's 0.8 is not argued with
    # the reference setup's four attention projections are exactly TaoToken's attention group: no warning
    assert not any("target_modules" in w for w in warnings)
    assert API_KEY not in out and "key2" not in out


def test_train_and_smoke_announce_the_config_and_the_warnings(project: Path, capsys) -> None:
    """train and smoke say which config runs (first line) and repeat the provider warnings
    before any work (on stderr: stdout is not a terminal, so it carries JSON events only); the
    skeleton has no [data], so train then stops naming data.train."""
    assert cli(["train", "--run-dir", str(project / "run")]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == (
        "config: config.toml (./config.toml exists in the working directory; no --config given)"
    )
    assert "model.provider = 'taotoken': not set;" in err
    assert "warning: lora.alpha = 64 is not sent" in err and "warning: model.temperature" in err
    assert "data.train" in err
    (project / "config.toml").unlink()
    assert cli(["smoke", "--question", "q"]) == 2  # stops at the missing --answer, after line 1
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("config: <embedded offline default> (no --config")


def test_a_provider_that_cannot_honour_a_setting_names_it(project: Path, capsys) -> None:
    text = FIXTURE.read_text(encoding="utf-8")
    text = text.replace('target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]',
                        'target_modules = ["q_proj", "v_proj", "c_attn"]')  # fmt: skip
    local = text.replace("[model]\n", '[model]\nprovider = "local"\n')
    corpus = '\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
    (project / "config.toml").write_text(local.replace('"zhihu"', '"local"') + corpus)
    assert cli(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "# model.provider = 'local': set in config.toml:" in out
    assert "# warning: search.api_keys is ignored by search provider 'local'" in out
    assert "# warning: model.api_base is ignored by provider 'local'" in out
    assert "# warning: model.api_key is ignored by provider 'local'" in out
    # the reference setup's dropout 0.05: the in-process learner scores with dropout off (on-policy ratio 1)
    assert "# warning: lora.dropout = 0.05 has no effect on provider 'local'" in out
    vllm = text.replace("[model]\n", '[model]\nprovider = "vllm"\n').replace(
        "top_p = 0.95", "top_p = 0.9"
    )
    (project / "config.toml").write_text(vllm.replace('"zhihu"', '"local"') + corpus)
    assert cli(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "# warning: model.top_p = 0.9 on provider 'vllm'" in out
    assert "# warning: lora.dropout = 0.05 has no effect on provider 'vllm'" in out
    (project / "config.toml").write_text(text)
    assert cli(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "adapts every module of attention (q_proj, k_proj, v_proj, o_proj)" in out
    assert "lora.target_modules ['c_attn'] have no counterpart on provider 'taotoken'" in out


# --------------------------------------------------------------------------- item 5


def test_an_empty_exported_variable_does_not_shadow_dotenv(project, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TAOTOKEN_API_KEY", "")
    assert cli(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert (
        "# warning: TAOTOKEN_API_KEY is exported but empty in the environment; using its value from"
    ) in out
    assert os.environ["TAOTOKEN_API_KEY"] == API_KEY


def test_an_empty_exported_variable_without_dotenv_is_named(project, monkeypatch, capsys) -> None:
    (project / ".env").write_text(f"ZHIHU_SEARCH_KEYS={ZHIHU_KEYS}\n", encoding="utf-8")
    monkeypatch.setenv("TAOTOKEN_API_KEY", "")
    assert cli(["config", "check"]) == 2
    err = capsys.readouterr().err
    assert (
        "model.api_key needs environment variable TAOTOKEN_API_KEY, which is exported but " in err
    )
    assert "`unset TAOTOKEN_API_KEY` and put TAOTOKEN_API_KEY=... in a .env file" in err


def test_a_literal_secret_is_warned_about(project: Path, capsys) -> None:
    text = FIXTURE.read_text(encoding="utf-8").replace('"${TAOTOKEN_API_KEY}"', '"sk-literal-9"')
    (project / "config.toml").write_text(text.replace('"${ZHIHU_SEARCH_KEYS}"', '"zk-1,zk-2"'))
    assert cli(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert (
        "model.api_key holds a literal secret: a config file is easy to commit and share. Write "
        '[model] api_key = "${TAOTOKEN_API_KEY}" and put TAOTOKEN_API_KEY=... in a .env file'
    ) in out
    assert "search.api_keys holds a literal secret" in out and "${ZHIHU_SEARCH_KEYS}" in out
    assert "sk-literal-9" not in out and "zk-1" not in out


# --------------------------------------------------------------------------- item 3


def test_smoke_reproduces_the_seed_example_through_the_fakes(project: Path, capsys) -> None:
    """The reference setup's smoke: its question, 4 trajectories, at most 4 searches; one key out of
    quota while the two others serve is a warning naming the key's index."""
    from searchr1.cli.smoke import main as smoke

    config = load_config(project / "config.toml", registry=load_registry())  # verbatim, .env loaded
    assert (config.model.provider, config.rollout.protocol) == ("taotoken", "tool_calls")
    with (
        FakePyTrio(policy=seed_policy(tiny_tokenizer())) as service,
        start_fake_zhihu(Behaviour(key_status={"key2": 429})) as (zhihu_url, zhihu),
    ):
        config = point_at_fakes(config, project, service.base_url, zhihu_url)
        code = smoke(smoke_args(project / "run"), config=config)
        out = capsys.readouterr().err  # smoke's report (stdout: its JSON events)
        assert set(zhihu.keys_served(429)) == {"key2"}
        assert service.count("samples") >= 4
    assert code == 0, out
    assert "search keys: 3" in out
    assert TRAJECTORY_LINE.findall(out) == SEED_LINES
    assert "search success rate: 100.00%" in out and "search error rate: 0.00%" in out
    assert "warning: 1 of 3 search keys benched (key 1 (quota exhausted (429)))" in out
    assert (
        "verdict: answers in the tool_calls format (one final `Answer: <short answer>` line)" in out
    )
    assert re.search(r"^smoke: PASS", out, re.M)
    assert API_KEY not in out and "key2" not in out


def test_smoke_fails_when_every_key_is_limited(project: Path, capsys) -> None:
    from searchr1.cli.smoke import main as smoke

    config = load_config(project / "config.toml", registry=load_registry())
    with (
        FakePyTrio(policy=seed_policy(tiny_tokenizer())) as service,
        start_fake_zhihu(Behaviour(all_status=429)) as (zhihu_url, _),
    ):
        code = smoke(smoke_args(project / "run"), config=point_at_fakes(
            config, project, service.base_url, zhihu_url))  # fmt: skip
    out = capsys.readouterr().err
    assert code == 1, out
    assert (
        "diagnosis: every search key is limited or rejected (key 0 (quota exhausted (429))" in out
    )
    assert "verdict: search success >= 90%: FAILED (0.00%" in out
    assert re.search(r"^smoke: FAILED: .*search success >= 90%.*a channel failed", out, re.M)


# --------------------------------------------------------------------------- item 6

#: The reference setup's section 4 script; only its two import lines are changed (the reference setup imports from
#: modules of its own: ``from rollout import ...`` and ``from search import ...``).
SEED_SCRIPT = """
import os
import asyncio
from searchr1.api import run_rollout_group
from searchr1.api import ZhihuSearchClient

async def main():
    # 从环境变量读取确认注入成功
    assert os.environ.get("TAOTOKEN_API_KEY"), "缺少 TAOTOKEN_API_KEY"
    keys = os.environ["ZHIHU_SEARCH_KEYS"].split(",")
    print(f"搜索 key 数量: {len(keys)}")
    search_client = ZhihuSearchClient(keys=keys, top_k=3)
    # 只跑 1 道题、4 条轨迹验证链路
    result = await run_rollout_group(
        question="Who is the author of The Little Prince and where was he born?",
        group_size=4,
        max_search_calls=4,
        search_client=search_client,
    )
    for i, traj in enumerate(result.trajectories):
        print(f"轨迹 {i}: reward={traj.reward}, "
              f"搜索次数={traj.search_calls}, "
              f"最终答案={traj.final_answer}")
    print(f"搜索成功率: {search_client.success_rate:.2%}")
    print(f"搜索错误率: {search_client.error_rate:.2%}")

asyncio.run(main())
"""

#: the reference setup's expected output (section 4, step 3)
SEED_OUTPUT = """搜索 key 数量: 3
轨迹 0: reward=1.0, 搜索次数=2, 最终答案=France
轨迹 1: reward=0.0, 搜索次数=3, 最终答案=Paris
轨迹 2: reward=-0.1, 搜索次数=4, 最终答案=None
轨迹 3: reward=1.0, 搜索次数=2, 最终答案=France
搜索成功率: 100.00%
搜索错误率: 0.00%
"""


def test_the_seed_smoke_script_runs_with_changed_imports(project: Path) -> None:
    """The script finds its model and the Zhihu address in ./config.toml (the skeleton with
    the fakes' addresses) and its keys in ./.env, as a user's project would hold them."""
    with (
        FakePyTrio(policy=seed_policy(tiny_tokenizer())) as service,
        start_fake_zhihu() as (zhihu_url, zhihu),
    ):
        tok_dir = project / "tokenizer"
        tiny_tokenizer().save_pretrained(tok_dir)
        text = FIXTURE.read_text(encoding="utf-8").replace(
            "https://taotoken.net/api", service.base_url
        )
        text = text.replace(
            'provider = "zhihu"\n', f'provider = "zhihu"\napi_base = "{zhihu_url}"\n'
        )
        text += f'\n[model.taotoken]\ntokenizer = "{tok_dir}"\nsdk_home = "{project / "home"}"\n'
        (project / "config.toml").write_text(text, encoding="utf-8")
        sys.modules.pop("searchr1.api", None)  # a fresh import loads ./.env, as in a new process
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exec(compile(SEED_SCRIPT, "seed_smoke.py", "exec"), {"__name__": "__main__"})
        assert len(zhihu.records) == 11  # 2 + 3 + 4 + 2 searches, one key after another
        assert {r.key for r in zhihu.records} == {"key1", "key2", "key3"}
    assert stdout.getvalue() == SEED_OUTPUT


def test_api_search_client_takes_provider_settings_and_names_an_unknown_one() -> None:
    """``ZhihuSearchClient(...)`` takes ``[search]`` settings (``timeout_seconds=``) and the
    provider's own (``search_db=``); a misspelt one is refused with the key named (and a
    suggestion), before any search."""
    from searchr1.api import ZhihuSearchClient
    from searchr1.core.errors import ConfigError

    client = ZhihuSearchClient(keys=["k1", " k2 "], top_k=2, timeout_seconds=3.5, search_db="all")
    assert client.config.search.api_keys == ("k1", "k2")
    assert client.config.search.timeout_seconds == 3.5
    assert client.provider.options.search_db == "all"
    assert client.provider.http.policy.attempt_timeout_s == 3.5  # what each request waits
    with pytest.raises(ConfigError, match=r"search\.zhihu\.search_bd.*did you mean 'search_db'"):
        ZhihuSearchClient(keys=["k1"], search_bd="all")


def test_skeleton_with_its_cold_start_uncommented_is_named_before_train(
    project: Path, capsys
) -> None:
    """The skeleton's commented cold start, uncommented on TaoToken: config check says train
    would stop (the service cannot run the cold start's cross-entropy loss), with the line."""
    config = project / "config.toml"
    config.write_text(config.read_text(encoding="utf-8") + "\n[train.cold_start]\nsteps = 16\n")
    assert cli(["config", "check"]) == 0
    out, err = capsys.readouterr()
    assert "2 warnings say train would stop here" in out.splitlines()[0]
    (line,) = [w for w in err.splitlines() if "train.cold_start.loss_fn" in w]
    assert re.search(
        r"config\.toml:\d+: train\.cold_start\.loss_fn = 'cross_entropy': "
        r"model\.provider = 'taotoken' trains only importance_sampling, ppo, cispo",
        line,
    ), line
    assert "set [train.cold_start] steps = 0 (train would stop here)" in line
