"""config.toml: the reference setup's skeleton parses, errors name the field/line/variable, secrets redact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.core.config import load_config, parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.toml.example"
ENV = {"TAOTOKEN_API_KEY": "sk-test-abcdef123456", "ZHIHU_SEARCH_KEYS": "zk-one-1111,zk-two-2222"}


def parse(text: str, env: dict[str, str] | None = None):
    return parse_config(
        text, source="cfg.toml", env=env if env is not None else ENV, registry=load_registry()
    )


def test_example_config_parses_with_seed_values() -> None:
    cfg = parse(EXAMPLE.read_text())
    assert (cfg.model.provider, cfg.search.provider) == ("taotoken", "zhihu")
    assert cfg.model.api_base == "https://taotoken.net/api"
    assert cfg.model.api_key == ENV["TAOTOKEN_API_KEY"]
    assert cfg.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert (cfg.rollout.group_size, cfg.rollout.max_search_calls) == (8, 4)
    assert cfg.search.api_keys == ("zk-one-1111", "zk-two-2222")
    assert (cfg.train.max_datum_tokens, cfg.train.max_micro_batch_tokens) == (8192, 64000)
    assert cfg.optimizer.betas == (0.9, 0.95)
    assert ENV["TAOTOKEN_API_KEY"] in cfg.secrets and "zk-two-2222" in cfg.secrets


def test_the_examples_local_table_uncommented_is_checked_and_read() -> None:
    """config.toml.example's commented ``[model.local]``, uncommented with provider "local",
    passes every check (the plugin's table included)."""
    from searchr1.core.config_validate import plugin_settings
    from searchr1.kit.learner.loading import LocalSettings

    text = EXAMPLE.read_text().replace('provider = "taotoken"', 'provider = "local"')
    block = re.search(r"^# \[model\.local\]\n(?:# .*\n)+", text, re.M).group(0)
    table = re.sub(r"^# ", "", block, flags=re.M)
    cfg = parse_config(
        text.replace(block, table),
        source="c.toml",
        env=ENV,
        check_plugins=True,
        registry=load_registry(),
    )
    assert (cfg.model.provider, cfg.model.device, cfg.model.dtype) == ("local", "auto", "auto")
    local = plugin_settings(cfg, "model", "local", LocalSettings)
    assert (local.threads, local.learner_chunk_tokens, local.fsdp) == (0, 8192, False)


def test_embedded_default_loads_without_any_variable() -> None:
    cfg = load_config(None, env={}, registry=load_registry())
    assert cfg.model.provider == "local" and cfg.search.provider == "local"
    assert cfg.model.base_model.startswith("builtin:")


def test_the_config_carries_its_registrys_assets_but_never_writes_them(tmp_path, monkeypatch):
    """``builtin:`` paths resolve against the assets of the registry the config was parsed
    with (a plugin's own asset included), kept by ``replace``, or that the API runs with;
    they are no setting: a config dump, ``repr()`` and ``==`` leave them out."""
    from types import SimpleNamespace

    from searchr1.api import load_api_config
    from searchr1.core.assets import resolve
    from searchr1.core.config_schema import Config
    from searchr1.core.hookspecs import hookimpl
    from searchr1.core.types import Asset

    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path))
    quiz = Asset("1", lambda folder: (folder / "q.jsonl").write_text("{}\n"))
    plugin = SimpleNamespace(register_assets=hookimpl(lambda register: register("quiz", quiz)))
    registry = load_registry(extra_plugins=[plugin])
    text = '[data]\ntrain = "builtin:quiz/q.jsonl"\n'
    cfg = parse_config(text, source="cfg.toml", env={}, registry=registry)
    cfg = cfg.replace(train={"max_steps": 2})
    assert cfg.assets["quiz"] is quiz and {"world", "tiny"} <= set(cfg.assets)
    assert Path(resolve(cfg.data.train, cfg.assets)) == tmp_path / "quiz-1" / "q.jsonl"
    plain = parse(text).replace(train={"max_steps": 2})
    assert "quiz" not in plain.assets and plain == cfg  # the same settings
    assert "assets" not in cfg.to_dict() and "Asset(" not in repr(cfg)
    unknown = r"unknown built-in asset 'builtin:quiz/q\.jsonl'; known: .*tiny-random, world"
    with pytest.raises(FileNotFoundError, match=unknown):  # the assets it was parsed with
        resolve(plain.data.train, plain.assets)
    # a config made in Python, given to the API, resolves against the plugins the API runs
    assert load_api_config(Config(), registry).assets["quiz"] is quiz


def test_misspelled_key_names_field_line_and_suggestion() -> None:
    text = EXAMPLE.read_text().replace("max_search_calls = 4", "max_serach_calls = 4")
    with pytest.raises(ConfigError) as err:
        parse(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "max_serach_calls" in t)
    msg = str(err.value)
    assert f"cfg.toml:{line}" in msg
    assert "rollout.max_serach_calls" in msg and "did you mean 'max_search_calls'" in msg


def test_missing_and_empty_variables_are_named_with_their_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse(EXAMPLE.read_text(), env={"ZHIHU_SEARCH_KEYS": "a,b", "TAOTOKEN_API_KEY": "  "})
    assert "TAOTOKEN_API_KEY" in str(err.value) and "model.api_key" in str(err.value)
    assert "is exported but empty" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse(EXAMPLE.read_text(), env={"ZHIHU_SEARCH_KEYS": "a,b"})
    assert "TAOTOKEN_API_KEY, which is not set" in str(err.value)


def test_all_problems_reported_at_once() -> None:
    text = """
[rollout]
group_size = 1
max_serach_calls = 2
[model]
top_p = 1.5
temperature = "hot"
[lora]
target_modules = []
[optimizer]
betas = [0.9]
"""
    with pytest.raises(ConfigError) as err:
        parse(text)
    problems = err.value.problems
    assert len(problems) == 6, problems
    joined = "\n".join(problems)
    for needle in (
        "rollout.group_size = 1 must be >= 2",
        "rollout.max_serach_calls",
        "model.top_p = 1.5 must be <= 1.0",
        "model.temperature must be float, got str",
        "lora.target_modules = [] must not be empty",
        "optimizer.betas = [0.9] must have exactly 2 values",
    ):
        assert needle in joined


def test_cross_field_rules() -> None:
    text = """
[rollout]
max_trajectory_tokens = 9000
[train]
max_datum_tokens = 8192
max_micro_batch_tokens = 4096
"""
    with pytest.raises(ConfigError) as err:
        parse(text)
    msg = str(err.value)
    assert "must fit in one datum" in msg and "must fit in one micro-batch" in msg


def test_unknown_section_and_plugin_tables() -> None:
    with pytest.raises(ConfigError, match="unknown section 'serach'; did you mean 'search'"):
        parse("[serach]\nprovider = 'x'\n")
    cfg = parse("[search]\nprovider = 'zhihu'\n[search.zhihu]\nsearch_db = 'static'\n")
    assert cfg.plugin_table("search", "zhihu") == {"search_db": "static"}
    assert cfg.plugin_table("search", "other") == {}


def test_redacted_dict_hides_every_secret() -> None:
    cfg = parse(EXAMPLE.read_text())
    dumped = repr(cfg.to_dict(redact=True))
    for secret in ("sk-test-abcdef123456", "zk-one-1111", "zk-two-2222"):
        assert secret not in dumped
    assert cfg.to_dict(redact=True)["model"]["api_key"] == "***"
    assert secret not in repr(cfg)


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchr1.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_config_check_cli(tmp_path: Path) -> None:
    import os

    base_env = {k: v for k, v in os.environ.items() if k not in ENV}
    cfg = tmp_path / "config.toml"
    cfg.write_text(EXAMPLE.read_text())
    # variables from a .env next to the config
    (tmp_path / ".env").write_text(
        "TAOTOKEN_API_KEY=sk-dotenv-999999\nZHIHU_SEARCH_KEYS=k1aaaa,k2bbbb\n"
    )
    ok = _cli("config", "check", "--config", str(cfg), env=base_env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert 'api_key = "***"' in ok.stdout and "sk-dotenv-999999" not in ok.stdout
    assert "k1aaaa" not in ok.stdout

    (tmp_path / ".env").unlink()
    missing = _cli(
        "config",
        "check",
        "--config",
        str(cfg),
        env={**base_env, "ZHIHU_SEARCH_KEYS": "a"},
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "TAOTOKEN_API_KEY" in missing.stderr

    cfg.write_text(EXAMPLE.read_text().replace("max_search_calls", "max_serach_calls"))
    typo = _cli("config", "check", "--config", str(cfg), env={**base_env, **ENV}, cwd=tmp_path)
    assert typo.returncode == 2
    assert "rollout.max_serach_calls" in typo.stderr and "max_search_calls" in typo.stderr
    assert "Traceback" not in typo.stderr


def test_plugin_settings_reports_every_problem_with_the_file_name() -> None:
    import dataclasses

    from searchr1.core.config_validate import plugin_settings

    @dataclasses.dataclass(frozen=True)
    class EngineSettings:
        depth: int = dataclasses.field(default=2, metadata={"min": 1})
        mode: str = "fast"

    text = "[search.engine]\ndepth = 0\nmdoe = 'slow'\n"
    config = parse_config(text, source="my.toml", env={}, registry=load_registry())
    with pytest.raises(ConfigError) as err:
        plugin_settings(config, "search", "engine", EngineSettings, lambda s: ["needs a key"])
    assert err.value.problems == [
        "my.toml: search.engine.depth = 0 must be >= 1",
        "my.toml: unknown key 'search.engine.mdoe'; did you mean 'mode'?",
        "my.toml: needs a key",
    ]
    ok = parse_config(
        "[search.engine]\ndepth = 3\n", source="my.toml", env={}, registry=load_registry()
    )
    assert plugin_settings(ok, "search", "engine", EngineSettings) == EngineSettings(depth=3)


def test_max_staleness_defaults_by_provider_and_a_written_value_wins() -> None:
    """Absent from the file: 1 for a remote training service (steps wait on it), 0 for a local
    provider (overlap only shares the cores); a value in the file is kept either way."""
    from searchr1.core.config import parse_config

    def staleness(text: str) -> tuple[int, str]:
        config = parse_config(text, source="t.toml", env={"K": "k"}, registry=load_registry())
        return config.train.max_staleness, config.choices["train.max_staleness"]

    remote = '[model]\napi_base = "http://127.0.0.1:1"\napi_key = "${K}"\n'
    assert (
        staleness(remote)[0] == 1 and "not set; 1 for provider 'taotoken'" in staleness(remote)[1]
    )
    assert staleness('[model]\nprovider = "tinker"\n')[0] == 1
    assert staleness('[model]\nbase_model = "builtin:tiny"\n') == (
        0,
        "not set; 0: synchronous steps (the model provider declares no other default)",
    )
    assert staleness(remote + "[train]\nmax_staleness = 0\n") == (0, "set in t.toml:5")
    assert staleness('[model]\nprovider = "local"\n[train]\nmax_staleness = 2\n')[0] == 2


def test_a_pasted_key_with_a_line_break_is_trimmed_with_a_warning() -> None:
    """``KEY=$(cat key.txt)`` or a key copied with its newline: the value sent is the key
    alone (a newline in an Authorization header fails every request), and the warning names
    the field and the variable but not the value."""
    text = '[model]\napi_base = "https://h.example/api"\napi_key = "${K}"\n'
    cfg = parse_config(
        text, source="c.toml", env={"K": " sk-pasted-123\n"}, registry=load_registry()
    )
    assert cfg.model.api_key == "sk-pasted-123"
    (warning,) = [w for w in cfg.warnings if "line break" in w]
    assert warning.startswith("c.toml:3: model.api_key: environment variable K has spaces")
    assert "sk-pasted-123" not in warning
