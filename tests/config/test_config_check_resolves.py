"""``searchr1 config check`` rejects what ``train`` would reject, naming the field and the fix.

Each case runs the real CLI in-process (``searchr1.cli.main.main``) against the installed
plugins (the built-ins register through the same entry points as third-party ones) and
checks the exit code (2 = a config error) and that the message names the field, the file
and what to write instead.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from searchr1.cli.main import main
from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry

GOOD = """
[model]
provider = "local"
[search]
provider = "local"
[search.local]
corpus = "builtin:world/corpus.jsonl"
[reward]
name = "format_answer"
[train]
loss_fn = "importance_sampling"
[data]
train = "builtin:world/train.jsonl"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no stray .env from the repo
    for var in ("SEARCHR1_CONFIG", "TAOTOKEN_API_KEY", "MY_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _check(project: Path, capsys, text: str | bytes) -> tuple[int, str, str]:
    path = project / "config.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    rc = main(["config", "check", "--config", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_good_config_passes(project: Path, capsys) -> None:
    rc, out, err = _check(project, capsys, GOOD)
    assert rc == 0, err
    assert "OK" in out


@pytest.mark.parametrize(
    ("old", "new", "field", "suggestion"),
    [
        ('[model]\nprovider = "local"', '[model]\nprovider = "locl"', "model.provider", "local"),
        ('[search]\nprovider = "local"', '[search]\nprovider = "zhiu"', "search.provider", "zhihu"),
        ('name = "format_answer"', 'name = "format_answr"', "reward.name", "format_answer"),
        (
            'loss_fn = "importance_sampling"',
            'loss_fn = "importance_sampl"',
            "train.loss_fn",
            "importance_sampling",
        ),
    ],
)
def test_unknown_plugin_names_are_rejected_with_did_you_mean(
    project: Path, capsys, old: str, new: str, field: str, suggestion: str
) -> None:
    rc, out, err = _check(project, capsys, GOOD.replace(old, new))
    assert rc == 2, out
    assert field in err and f"did you mean {suggestion!r}" in err.lower()
    assert "config.toml:" in err  # the file and line
    assert "Traceback" not in err


def test_a_plugin_table_for_no_installed_plugin_is_named(project: Path, capsys) -> None:
    rc, out, err = _check(project, capsys, GOOD.replace("[search.local]", "[search.lcoal]"))
    assert rc == 2, out
    assert "[search.lcoal]" in err and "[search.local]" in err
    assert "config.toml:6" in err


def test_a_plugin_table_in_a_section_without_plugins_is_named(project: Path, capsys) -> None:
    rc, out, err = _check(project, capsys, GOOD + "[lora.extra]\nx = 1\n")
    assert rc == 2, out
    assert "[lora.extra]" in err


def test_the_loss_table_is_accepted(project: Path, capsys) -> None:
    rc, _, err = _check(project, capsys, GOOD + "[train.loss]\nclip_low = 0.1\n")
    assert rc == 0, err


def test_an_empty_file_says_so_and_what_would_be_used(project: Path, capsys) -> None:
    rc, out, err = _check(project, capsys, "\n# only a comment\n\n")
    assert rc == 2, out
    assert "empty" in err and "config.toml" in err
    assert "default" in err and "offline demo" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
@pytest.mark.parametrize("field", ["weight_decay", "grad_clip", "lr"])
def test_non_finite_numbers_are_rejected(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            f"[optimizer]\n{field} = {value}\n", source="c.toml", env={}, registry=load_registry()
        )
    assert f"optimizer.{field}" in str(info.value) and "finite" in str(info.value)


def test_inf_stays_allowed_where_it_means_forever() -> None:
    text = '[search]\nprovider = "zhihu"\nkey_cooldown_seconds = inf\n'
    assert (
        parse_config(
            text, source="c.toml", env={}, registry=load_registry()
        ).search.key_cooldown_seconds
        == math.inf
    )
    text = '[search]\nprovider = "zhihu"\n[search.zhihu]\nkey_cooldown_seconds = inf\n'
    assert (
        parse_config(
            text, source="c.toml", env={}, registry=load_registry()
        ).search.key_cooldown_seconds
        == math.inf
    )
    with pytest.raises(ConfigError, match="finite"):
        parse_config(
            "[search]\nkey_cooldown_seconds = nan\n",
            source="c.toml",
            env={},
            registry=load_registry(),
        )


def test_bytes_that_are_not_utf8_are_named(project: Path, capsys) -> None:
    rc, out, err = _check(project, capsys, b'[run]\nname = "caf\xe9"\n')
    assert rc == 2, out
    assert "UTF-8" in err and "config.toml" in err and "line 2" in err
    assert "Traceback" not in err


def test_a_utf8_bom_is_accepted(project: Path, capsys) -> None:
    rc, _, err = _check(project, capsys, "\ufeff" + GOOD)
    assert rc == 0, err


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("htp://taotoken.net/api", "'htp'"),
        ("taotoken.net/api", "no scheme"),
        ("https://", "no host"),
    ],
)
def test_api_base_with_a_wrong_scheme_is_named(value: str, expect: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            f'[model]\napi_base = "{value}"\n', source="c.toml", env={}, registry=load_registry()
        )
    text = str(info.value)
    assert "c.toml:2" in text and "model.api_base" in text and expect in text
    assert "https://" in text  # the fix


def test_config_check_names_a_typo_in_a_chosen_plugins_table(project: Path, capsys) -> None:
    """A chosen plugin's declared settings (a provider's) and the cold start's are checked like the
    core's own sections, with the line; an unchosen plugin's table is left alone."""
    text = (
        '[model]\nprovider = "local"\n[model.local]\ndevcie = "cpu"\n'
        "[model.vllm]\nanything = 1\n[train.cold_start]\nstpes = 3\nlr = -1.0\n"
    )
    rc, _, err = _check(project, capsys, text)
    assert rc == 2
    assert ":4: unknown key 'model.local.devcie'; did you mean 'device'?" in err, err
    assert ":8: unknown key 'train.cold_start.stpes'; did you mean 'steps'?" in err, err
    assert ":9: train.cold_start.lr = -1.0 must be > 0.0" in err, err
    assert "model.vllm" not in err


def test_a_url_in_a_plugin_table_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"search\.search_r1\.api_base"):
        parse_config(
            '[search.search_r1]\napi_base = "127.0.0.1:8000"\n',
            source="c.toml",
            env={},
            registry=load_registry(),
        )


def test_good_urls_pass() -> None:
    config = parse_config(
        '[model]\napi_base = "http://127.0.0.1:8000/v1"\n[search]\napi_base = "https://h"\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    assert config.model.api_base == "http://127.0.0.1:8000/v1"


def test_a_missing_data_file_is_a_warning(project: Path, capsys) -> None:
    rc, out, err = _check(
        project, capsys, GOOD.replace("builtin:world/train.jsonl", "nowhere/train.jsonl")
    )
    assert rc == 0, err  # data is often downloaded after the config is written
    assert "warning" in err and "data.train" in err and "nowhere/train.jsonl" in err


def test_an_integer_beyond_64_bits_is_named() -> None:
    with pytest.raises(ConfigError, match=r"run\.seed must fit in 64 bits"):
        parse_config(
            "[run]\nseed = 99999999999999999999999\n",
            source="c.toml",
            env={},
            registry=load_registry(),
        )


def test_a_dotenv_that_is_not_utf8_is_named(project: Path, capsys) -> None:
    (project / ".env").write_bytes(b"A=\xff\xfe\n")
    rc, out, err = _check(project, capsys, GOOD)
    assert rc == 2, out
    assert ".env" in err and "UTF-8" in err


def test_a_folder_as_config_is_named(project: Path, capsys) -> None:
    (project / "conf").mkdir()
    rc = main(["config", "check", "--config", "conf"])
    assert rc == 2
    assert "conf: is a folder" in capsys.readouterr().err
