"""The docs a user reads agree with the code: the generated reference pages are current and
name every config key and CLI flag, an emitted metric the tables do not describe is named,
and every example config passes ``searchr1 config check``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from pathlib import Path

import gen_docs
import pytest
from metric_docs import WATCH, undocumented

from searchr1.core.metric_schema import SCHEMA, declared

ROOT = Path(__file__).resolve().parents[2]
#: every config a user copies: config.toml.example and examples/
EXAMPLES = [ROOT / "config.toml.example", *sorted((ROOT / "examples").glob("*.toml"))]


@pytest.mark.parametrize("page", sorted(gen_docs.PAGES))
def test_the_generated_reference_page_is_current(page: str) -> None:
    committed = (ROOT / "docs" / "reference" / page).read_text()
    assert committed == gen_docs.PAGES[page](), (
        f"docs/reference/{page} is out of date with the code: run ./dev docs gen "
        "(python scripts/gen_docs.py) and commit it"
    )


def _rows_under(page: str, heading: str) -> set[str]:
    """The first-column names of the table under ``heading`` (up to the next heading)."""
    text = page.split(f"\n{heading}\n", 1)[1]
    section = text.split("\n#", 1)[0]
    return {
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
    }


def test_every_config_key_is_in_the_reference_under_its_table() -> None:
    from searchr1.core.config_schema import SECTIONS, TRAIN_TABLES

    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    tables = {f"[{name}]": cls for name, cls in SECTIONS.items()}
    tables |= {f"[train.{name}]": cls for name, cls in TRAIN_TABLES.items()}
    for section, entries in gen_docs.plugin_tables().items():
        tables |= {f"[{section}.{table}]": cls for table, cls, _ in entries}
    assert "[model.local]" in tables and "[search.zhihu]" in tables and "[train.loss]" in tables
    for table, cls in tables.items():
        level = "##" if table.count(".") == 0 else "###"
        documented = _rows_under(page, f"{level} `{table}`")
        missing = {f.name for f in dataclasses.fields(cls)} - documented
        assert not missing, f"{table}: {sorted(missing)} not in docs/reference/config.md"


def test_every_command_and_flag_is_in_the_cli_reference() -> None:
    from searchr1.cli.main import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    commands = list(gen_docs._subcommands(build_parser()))
    assert {p.prog for _, p in commands} >= {"searchr1 train", "searchr1 config check"}
    for _, parser in commands:
        documented = _rows_under(page, f"## `{parser.prog}`")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = ", ".join(action.option_strings) or action.dest
            assert name in documented, f"{parser.prog} {name} not in docs/reference/cli.md"
    for code in ("| 2 |", "| 3 |", "| 4 |", "| 5 |", "| 130 / 143 |"):
        assert code in page  # every exit code, 5 included


def test_an_emitted_key_or_event_the_tables_do_not_describe_is_named() -> None:
    events = [
        {"event": "metrics", "step": 1, "reward/format": 1.0, "health/searches/nq": 1.0,
         "search/key_calls/3": 2.0, "mismatch/server1/k3": 0.0, "brand_new/metric": 1.0},
        {"event": "checkpoint", "step": 1, "path": "x"},
        {"event": "brand_new_event"},
    ]  # fmt: skip
    assert undocumented(events) == ["event brand_new_event", "metric brand_new/metric"]


def test_every_event_the_package_logs_by_name_has_a_row() -> None:
    """Read off the source: ``logger.warning("name", ...)``, ``log.info("name", ...)`` and
    ``warn("name", ...)`` calls (events named at run time, such as ``metrics``, are checked
    on real runs' events above)."""
    import re

    from metric_docs import EVENTS

    call = re.compile(r'(?:\.(?:debug|info|warning|error)|\bwarn)\(\s*"([a-z][a-z0-9_./]*)"')
    logged = {
        name: path.relative_to(ROOT)
        for path in sorted((ROOT / "searchr1").rglob("*.py"))
        for name in call.findall(path.read_text(encoding="utf-8"))
    }
    assert len(logged) > 40  # the pattern still finds the package's events
    rows = {name for name, *_ in EVENTS}
    missing = {name: str(path) for name, path in logged.items() if name not in rows}
    assert not missing, f"events with no row in scripts/metric_docs.py EVENTS: {missing}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_passes_config_check(
    example: Path, run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys an example reads from .env are set (values a user's .env would hold); data
    files not downloaded yet are warnings, as they are for a user before `data get`. A
    built-in asset the example names is built on first use (the test run's cache is empty at
    its start), which stderr announces and the check's notes say."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-example")
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", "key1,key2")
    result = run_cli("config", "check", "--config", example)
    assert result.code == 0, result.err
    assert result.out.startswith(f"# {example}: OK"), result.out.splitlines()[0]
    announced = []
    for line in result.err.splitlines():
        if line.startswith("{"):  # the events of a build: what, why, how long, where
            assert json.loads(line)["event"] in ("asset_building", "asset_built", "asset_waiting")
        elif line.startswith("searchr1: building builtin:"):
            announced.append(line.split()[2])
        elif not line.startswith(("searchr1: built builtin:", "searchr1: waiting for another")):
            # else only data not there yet
            assert "data/nq_hotpotqa/" in line and "file not found" in line, line
    notes = [line.split()[2] for line in result.out.splitlines() if line.startswith("# built ")]
    assert notes == announced, (result.out, result.err)


def test_what_to_watch_names_declared_keys_and_the_page_lists_every_key() -> None:
    """``scripts/metric_docs.py``'s hints name keys of the schema, and the generated page has a
    row for each key the schema declares."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    assert [k for k in WATCH if declared(k) is None] == []
    assert [m.key for g in SCHEMA for m in g.metrics if f"| `{m.key}` |" not in page] == []


def _world_corpus(example: Path) -> str:
    """The ``builtin:world`` corpus ``example`` searches, or ``""``."""
    corpus = tomllib.loads(example.read_text()).get("search", {}).get("local", {}).get("corpus")
    return corpus if str(corpus).startswith("builtin:world/") else ""


#: the examples that search the built-in fictional world
WORLD_EXAMPLES = [p for p in EXAMPLES if _world_corpus(p)]


@pytest.mark.parametrize("example", WORLD_EXAMPLES, ids=[p.name for p in WORLD_EXAMPLES])
def test_an_example_on_the_builtin_world_asks_smoke_a_question_of_that_world(
    example: Path,
) -> None:
    """The reference setup's smoke question (The Little Prince) has no answer in the fictional
    world: an example that searches the world names a ``[smoke]`` question whose answers its
    corpus holds."""
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    smoke = tomllib.loads(example.read_text()).get("smoke", {})
    assert smoke.get("question") and smoke.get("answers"), f"{example.name}: no [smoke] question"
    text = Path(resolve(_world_corpus(example), load_registry().assets)).read_text()
    assert all(answer in text for answer in smoke["answers"]), smoke


def test_the_docs_site_wraps_messages_rather_than_cut_them() -> None:
    """A message quoted in the docs (a fence without a language: language-text once
    ``pygments_lang_class`` names it) wraps; its end, which says what to do, is not cut at
    the page's right edge."""
    import yaml

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    highlight = next(
        e["pymdownx.highlight"] for e in site["markdown_extensions"] if "pymdownx.highlight" in e
    )
    assert highlight["pygments_lang_class"] is True
    css = "".join((ROOT / "docs" / sheet).read_text() for sheet in site["extra_css"])
    rule = css[css.index(".md-typeset .language-text pre > code") :].split("}")[0]
    assert "white-space: pre-wrap" in rule
