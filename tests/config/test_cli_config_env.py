"""``$SEARCHR1_CONFIG``: the config a command uses when ``--config`` is not given.

The container image sets ``SEARCHR1_CONFIG=/workspace/config.toml`` and compose mounts the
user's project folder there, so ``docker compose run smoke`` uses the user's config.toml when
it exists and the embedded offline demo when it does not (a fresh clone, no keys). These tests
run the CLI in-process (``searchr1.cli.main.main``) the way the container's entry point does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1.cli.main import main


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no stray .env from the repo
    return tmp_path


#: the search corpus every command needs (the schema leaves [search.local] corpus unset)
CORPUS = '[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'


def _config_check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["config", "check", *argv])
    return rc, capsys.readouterr().out


def test_existing_file_is_used(project: Path, monkeypatch, capsys) -> None:
    cfg = project / "config.toml"
    cfg.write_text("[train]\nmax_steps = 7\n" + CORPUS)
    monkeypatch.setenv("SEARCHR1_CONFIG", str(cfg))
    rc, out = _config_check(capsys)
    assert rc == 0
    assert out.startswith(f"# {cfg}: OK")
    assert "max_steps = 7" in out


def test_missing_file_falls_back_to_the_embedded_default(project, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SEARCHR1_CONFIG", str(project / "config.toml"))
    rc, out = _config_check(capsys)
    assert rc == 0
    assert out.startswith("# <embedded offline default>: OK")


def test_explicit_config_wins(project: Path, monkeypatch, capsys) -> None:
    (project / "env.toml").write_text("[train]\nmax_steps = 7\n" + CORPUS)
    (project / "flag.toml").write_text("[train]\nmax_steps = 9\n" + CORPUS)
    monkeypatch.setenv("SEARCHR1_CONFIG", str(project / "env.toml"))
    rc, out = _config_check(capsys, "--config", str(project / "flag.toml"))
    assert rc == 0
    assert "max_steps = 9" in out


def test_a_broken_env_config_is_reported_not_skipped(project: Path, monkeypatch, capsys) -> None:
    cfg = project / "config.toml"
    cfg.write_text("[train]\nmax_stepz = 7\n")
    monkeypatch.setenv("SEARCHR1_CONFIG", str(cfg))
    assert main(["config", "check"]) == 2
    assert "max_stepz" in capsys.readouterr().err
