"""Plugins own their settings; a key several providers read (the reference skeleton's
``[model] api_key``, ``[search] api_keys``) has one home, its section (a provider's table
that writes it is refused with that home named); the provider a file leaves out is the one a plugin claims or declares
the default, and the core config modules name no built-in plugin."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from searchr1.core.config import parse_config
from searchr1.core.config_schema import setting
from searchr1.core.config_validate import advice, plugin_settings
from searchr1.core.errors import ConfigError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import load_registry
from searchr1.plugins.zhihu_search import ZhihuSettings

ROOT = Path(__file__).resolve().parents[2]
ENV = {"TAOTOKEN_API_KEY": "sk-test-abcdef123456", "ZHIHU_SEARCH_KEYS": "zk-1111,zk-2222"}
SKELETON = """
[model]
api_base = "https://taotoken.net/api"
api_key = "${TAOTOKEN_API_KEY}"
[search]
provider = "zhihu"
api_keys = "${ZHIHU_SEARCH_KEYS}"
timeout_seconds = 4
"""


def test_the_skeletons_keys_are_fields_of_their_sections() -> None:
    config = parse_config(SKELETON, source="c.toml", env=ENV, registry=load_registry())
    assert config.model.provider == "taotoken"
    assert (config.model.api_base, config.model.api_key) == (
        "https://taotoken.net/api",
        ENV["TAOTOKEN_API_KEY"],
    )
    assert config.search.api_keys == ("zk-1111", "zk-2222") and config.search.timeout_seconds == 4
    assert config.search.max_retries == 2
    # the variable behind the key is known (errors name it)
    assert config.variables["model.api_key"] == "TAOTOKEN_API_KEY"
    dumped = repr(config.to_dict(redact=True)) + repr(config)
    assert "sk-test-abcdef123456" not in dumped and "zk-2222" not in dumped


def test_a_shared_key_in_the_providers_table_is_refused_with_its_home_named() -> None:
    text = SKELETON + "[search.zhihu]\ntimeout_seconds = 7\nsearch_db = 'all'\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="c.toml", env=ENV, check_plugins=True, registry=load_registry())
    assert caught.value.problems == [
        "c.toml:10: unknown key 'search.zhihu.timeout_seconds'; timeout_seconds is a [search] "
        "setting: write it under [search]"
    ]
    # a typo of one is offered with its home
    with pytest.raises(ConfigError, match=r"did you mean 'api_base'\? api_base is a \[model\]"):
        parse_config(
            '[model]\nprovider = "vllm"\n[model.vllm]\napi_bsae = "http://h:1"\n',
            source="c.toml",
            env={},
            check_plugins=True,
            registry=load_registry(),
        )
    config = parse_config(
        SKELETON + "[search.zhihu]\nsearch_db = 'all'\n",
        source="c.toml",
        env=ENV,
        check_plugins=True,
        registry=load_registry(),
    )
    assert plugin_settings(config, "search", "zhihu", ZhihuSettings).search_db == "all"


def test_a_key_the_provider_does_not_read_stays_unknown_in_its_table() -> None:
    text = '[model]\nprovider = "local"\n[model.local]\napi_key = "${K}"\n'
    with pytest.raises(ConfigError, match=r"c\.toml:4: unknown key 'model\.local\.api_key'"):
        parse_config(
            text, source="c.toml", env={"K": "k-1"}, check_plugins=True, registry=load_registry()
        )


def test_a_section_value_is_checked_where_it_is_written() -> None:
    with pytest.raises(ConfigError, match=r"c\.toml:4: search\.timeout_seconds = -1 must be > 0"):
        parse_config(
            '[search]\nprovider = "zhihu"\n\ntimeout_seconds = -1\n',
            source="c.toml",
            env={},
            registry=load_registry(),
        )


def test_a_key_no_plugin_reads_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown key 'model.api_bsae'"):
        parse_config(
            '[model]\napi_bsae = "https://h"\n', source="c.toml", env={}, registry=load_registry()
        )


def test_a_key_the_chosen_provider_does_not_read_is_named() -> None:
    config = parse_config(
        '[model]\nprovider = "local"\napi_key = "x-lit"\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    lines = advice(config, load_registry())
    assert any(line.startswith("model.api_key is ignored by provider 'local'") for line in lines)
    assert "model.api_key holds a literal secret" in " ".join(config.warnings)


def test_the_default_provider_is_declared_by_a_plugin() -> None:
    config = parse_config(
        '[model]\nbase_model = "builtin:tiny"\n', source="c.toml", env={}, registry=load_registry()
    )
    assert (config.model.provider, config.search.provider) == ("local", "local")
    assert config.choices["model.provider"] == (
        "not set; no installed plugin claims [model], so the default: the model runs in this "
        "process"
    )


def _claiming_plugin() -> SimpleNamespace:
    @dataclass(frozen=True)
    class Settings:
        api_key: str = setting("", secret=True)

    def make(config):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    @hookimpl
    def register_model_providers(register):  # type: ignore[no-untyped-def]
        register(
            "rival",
            make,
            settings=Settings,
            infer_provider=lambda table: "it sets api_key" if "api_key" in table else None,
        )

    return SimpleNamespace(
        __name__="rival_plugin", register_model_providers=register_model_providers
    )


def test_two_plugins_claiming_one_file_is_a_config_error() -> None:
    registry = load_registry(extra_plugins=[_claiming_plugin()])
    with pytest.raises(
        ConfigError,
        match=r"'rival' and 'taotoken' each claim it|'taotoken' and 'rival' each claim it",
    ):
        parse_config(
            '[model]\napi_key = "${K}"\n', source="c.toml", env={"K": "k-1"}, registry=registry
        )
    # a provider named in the file settles it
    config = parse_config(
        '[model]\nprovider = "rival"\napi_key = "${K}"\n',
        source="c.toml",
        env={"K": "k-1"},
        registry=registry,
    )
    assert config.model.api_key == "k-1" and "k-1" in config.secrets


def test_no_core_config_module_names_a_built_in_plugin() -> None:
    registry = load_registry()
    providers = [
        reg
        for kind in ("model_provider", "search_provider")
        for reg in registry.entries[kind].values()
    ]
    names = {reg.name for reg in providers} | {reg.plugin for reg in providers}
    for path in sorted((ROOT / "searchr1" / "core").glob("config*.py")):
        text = path.read_text()
        for name in names:
            if name == "local":  # also an English word; as a name it would be quoted
                assert not re.search(r"[\"']local[\"']", text), f"{path.name}: 'local'"
            else:
                assert not re.search(rf"\b{name}\b", text, re.I), f"{path.name}: {name}"


def test_keys_in_the_table_of_a_plugin_that_declares_no_settings_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    """A plugin without declared settings cannot have its table checked: `config check` says
    which keys go unchecked instead of passing a typo silently."""
    import sys

    from cli_run import docs_example, make_config, write_config

    # the docs' search and reward examples declare no settings; the reward is a shaping term
    (tmp_path / "quiet_search.py").write_text(docs_example("register_search_providers"))
    (tmp_path / "quiet_reward.py").write_text(docs_example("register_rewards"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SEARCHR1_PLUGINS", "quiet_search,quiet_reward")
    text = make_config(
        search={"provider": "echo", "local": None, "echo": {"top": 3, "urll": "x"}},
        reward={"terms": ["no_repeat"], "no_repeat": {"penalti": 1.0}},
    )
    try:
        result = run_cli("config", "check", "--config", write_config(tmp_path, text))
    finally:
        sys.modules.pop("quiet_search", None)
        sys.modules.pop("quiet_reward", None)

    assert result.code == 0, result.err
    assert re.search(
        r"# warning: .*config\.toml:\d+: \[search\.echo\] sets top, urll, which search provider "
        r"'echo' \(plugin 'quiet_search'\) does not declare, so none of them is checked",
        result.out,
    ), result.out
    assert re.search(
        r"# warning: .*config\.toml:\d+: \[reward\.no_repeat\] sets penalti, which reward "
        r"'no_repeat' \(plugin 'quiet_reward'\) does not declare",
        result.out,
    ), result.out
