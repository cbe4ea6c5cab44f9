"""Redaction by value: a key that reaches the config through ``${VAR}`` is masked wherever it
shows up, not only in the field meant for it (``config check``, error messages, the
checkpoint's config dump, log events)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from searchr1.cli.main import main
from searchr1.core.config import load_config, parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry

KEY = "sk-live-4f9a8b7c6d5e"
CRED = "cred-0a1b2c3d4e"  # in a variable whose name does not look secret

CONFIG = """
[model]
provider = "local"
api_base = "https://h.example/v1?key=${TAOTOKEN_API_KEY}"
api_key = "${CRED_VALUE}"
[search]
provider = "local"
api_base = "https://s.example/?auth=${CRED_VALUE}"
[search.local]
corpus = "builtin:world/corpus.jsonl"
stopwords = "token ${TAOTOKEN_API_KEY} here"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAOTOKEN_API_KEY", KEY)
    monkeypatch.setenv("CRED_VALUE", CRED)
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    (tmp_path / "config.toml").write_text(CONFIG)
    return tmp_path


def test_config_check_masks_a_key_inside_a_url(project: Path, capsys) -> None:
    # config check prints a plugin table as written, a string holding a key masked.
    rc = main(["config", "check", "--config", str(project / "config.toml")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert KEY not in out and CRED not in out
    assert "https://h.example/v1?key=***" in out
    assert "https://s.example/?auth=***" in out
    assert "token *** here" in out


def test_the_checkpoint_config_dump_is_masked(project: Path, tmp_path: Path) -> None:
    from searchr1.core.checkpoint import save_checkpoint

    class _StateWriter:
        """The one Trainer method save_checkpoint calls; what the model saves does not
        matter here, the config dump next to it does."""

        def save_state(self, path: str) -> None:
            Path(path).mkdir(parents=True)
            (Path(path) / "state.json").write_text("{}")

    config = load_config(project / "config.toml", registry=load_registry())
    folder = save_checkpoint(tmp_path / "run", 1, _StateWriter(), config, {"data": {}})  # type: ignore[arg-type]
    dump = (folder / "config.toml").read_text()
    assert KEY not in dump and CRED not in dump
    assert "key=***" in dump


def test_error_messages_mask_the_key(project: Path, capsys) -> None:
    (project / "config.toml").write_text(
        '[model]\napi_base = "htp://h.example/v1?key=${TAOTOKEN_API_KEY}"\n'
    )
    rc = main(["config", "check", "--config", str(project / "config.toml")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "model.api_base" in err and "'htp'" in err
    assert KEY not in err and "key=***" in err


def test_parse_config_masks_a_value_in_a_range_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            '[model]\napi_key = "${K}"\n[search]\napi_base = "ftp://x/${K}"\n',
            source="c.toml",
            env={"K": "abcd1234"},
            registry=load_registry(),
        )
    assert "abcd1234" not in str(info.value)


def test_log_events_mask_the_key_everywhere(project: Path) -> None:
    from searchr1.core.logs import get_logger, setup_logging

    config = load_config(project / "config.toml", registry=load_registry())
    stream = io.StringIO()
    setup_logging("t", project / "events.jsonl", secrets=config.secrets, stream=stream)
    get_logger().info("request", url=f"https://h.example/v1?key={KEY}", detail=f"used {CRED}")
    for text in (stream.getvalue(), (project / "events.jsonl").read_text()):
        assert KEY not in text and CRED not in text
        assert json.loads(text.splitlines()[-1])["url"] == "https://h.example/v1?key=***"


def test_only_secret_looking_variable_names_are_masked_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A variable counts as secret by a KEY(S)/TOKEN/PASSWORD part of its name or SECRET in it
    (HF_TOKEN, ZHIHU_SEARCH_KEYS); MAX_TOKENS is a number, not a secret: masking its "2048"
    would blank every 2048 in the logs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_TOKENS", "2048")
    monkeypatch.setenv("HF_TOKEN", "hf-abcdef123456")
    monkeypatch.delenv("SEARCHR1_CONFIG", raising=False)
    (tmp_path / "c.toml").write_text(
        '[model]\nprovider = "local"\nmax_new_tokens = 2048\n'
        '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
        'stopwords = "${HF_TOKEN} and ${MAX_TOKENS}"\n'
    )
    config = load_config(str(tmp_path / "c.toml"), registry=load_registry())
    assert "hf-abcdef123456" in config.secrets and "2048" not in config.secrets
    assert main(["config", "check", "--config", str(tmp_path / "c.toml")]) == 0
    out = capsys.readouterr().out
    assert 'stopwords = "*** and 2048"' in out and "max_new_tokens = 2048" in out


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        # config keys and variables (the config's two old rules) ...
        ("api_key", True), ("api_keys", True), ("ZHIHU_SEARCH_KEYS", True), ("HF_TOKEN", True),
        ("DB_PASSWORD", True), ("client_secret", True), ("AWS_ACCESS_KEY_ID", True),
        ("MAX_TOKENS", False), ("max_new_tokens", False), ("key_cooldown_seconds", False),
        ("key_probe_seconds", False), ("tokenizer", False), ("api_base", False),
        # ... and HTTP header and query names (the HTTP client's old rule)
        ("Authorization", True), ("X-Api-Key", True), ("apiKey", True), ("accessToken", True),
        ("Cookie", True), ("X-Amz-Signature", True), ("Content-Type", False),
        ("User-Agent", False), ("monkey", False),
    ],
)  # fmt: skip
def test_one_rule_names_a_secret_in_a_config_a_variable_and_a_request(name, secret) -> None:
    from searchr1.core.secrets import is_secret_name

    assert is_secret_name(name) is secret


def test_every_secret_field_of_the_core_schema_has_a_secret_name() -> None:
    """``Config.to_dict`` masks a core field by its name, so a field marked ``secret`` needs a
    secret-looking name (a config built in code has no :attr:`Config.secrets` to mask by)."""
    import dataclasses

    from searchr1.core.config_schema import SECTIONS, Config, ModelConfig, SearchConfig
    from searchr1.core.secrets import is_secret_name

    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            assert not f.metadata.get("secret") or is_secret_name(f.name), (
                f"{cls.__name__}.{f.name}"
            )
    config = Config(model=ModelConfig(api_key="k"), search=SearchConfig(api_keys=("a", "b")))
    dumped = config.to_dict()
    assert dumped["model"]["api_key"] == "***" and dumped["search"]["api_keys"] == ["***", "***"]
