"""Resolve a loaded config against what is installed: plugin names, plugin tables, data files.

:func:`searchr1.core.config.load_config` checks a file on its own (schema, types, ranges,
URLs). What it cannot know is which plugins are installed. ``searchr1 config check`` calls
:func:`resolve_config` after loading, and every run (``train``, ``smoke``, ``eval``, through
:func:`searchr1.core.runs.open_run`) calls :func:`check_plugin_choices` before it creates any
plugin, so a typo is reported at once, naming the field and its line, instead of surfacing
later as an error about something else (a ``[search.lcoal]`` table is otherwise silently
ignored and the provider then complains that it has no corpus).

Every plugin kind is chosen by one config field (:data:`searchr1.core.plugins.KINDS`); a
plugin's own settings live in ``[<section>.<its name>]``, where ``<section>`` is the section
of that field. ``[train.loss]`` (clip bounds, ratio cap) and ``[train.health]`` (alert
thresholds) are the fixed names.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from searchr1.core.config import Config, ConfigError, _key_lines
from searchr1.core.plugins import KINDS, Registry

#: plugin tables that belong to a section although no plugin is registered under that name
FIXED_TABLES: dict[str, frozenset[str]] = {"train": frozenset({"loss", "health"})}


def _locator(config: Config):  # type: ignore[no-untyped-def]
    """``where(dotted) -> "file:line"`` for the config's own file (just the source when the
    config did not come from a readable file, e.g. the embedded default)."""
    try:
        lines = _key_lines(Path(config.source).read_text("utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        lines = {}

    def where(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{config.source}:{line}" if line else config.source

    return where


def plugin_problems(config: Config, registry: Registry) -> list[str]:
    """One line per plugin name that no installed plugin registered, and per plugin table
    ``[section.name]`` that belongs to no installed plugin, each with a "did you mean"."""
    where = _locator(config)
    problems: list[str] = []
    tables: dict[str, set[str]] = {}
    for kind, (_, field_name) in KINDS.items():
        section, _, key = field_name.partition(".")
        names = registry.names(kind)
        tables.setdefault(section, set()).update(names)
        chosen = getattr(getattr(config, section, None), key, None)
        for name in chosen if isinstance(chosen, list | tuple) else [chosen]:
            if not isinstance(name, str) or not name or name in names:
                continue  # an empty name is left to whoever infers or rejects it
            hint = difflib.get_close_matches(name, names, n=1)
            mean = f"did you mean {hint[0]!r}? " if hint else ""
            problems.append(
                f"{where(field_name)}: {field_name} = {name!r}: no {kind.replace('_', ' ')} of "
                f"that name is installed; {mean}installed: {', '.join(names) or '(none)'} "
                f"(`searchr1 plugins` lists them)"
            )
    for dotted in config.plugins:
        section, _, name = dotted.partition(".")
        allowed = sorted(tables.get(section, set()) | FIXED_TABLES.get(section, frozenset()))
        if name in allowed:
            continue
        if not allowed:
            problems.append(
                f"{where(dotted)}: [{dotted}]: [{section}] takes no plugin tables; "
                f"remove it or move its keys into [{section}]"
            )
            continue
        hint = difflib.get_close_matches(name, allowed, n=1)
        mean = f"did you mean [{section}.{hint[0]}]? " if hint else ""
        problems.append(
            f"{where(dotted)}: [{dotted}]: no installed plugin is called {name!r}, so these "
            f"settings would be ignored; {mean}tables allowed in [{section}]: "
            + ", ".join(f"[{section}.{n}]" for n in allowed)
        )
    return problems


def data_problems(config: Config) -> list[str]:
    """A ``data.train`` / ``data.eval`` that names a file that does not exist (``train`` and
    ``eval`` would stop on it; an empty value is fine here, ``smoke`` needs none)."""
    from searchr1.core.builtins import is_builtin, resolve

    where = _locator(config)
    problems = []
    for field_name in ("train", "eval"):
        path = getattr(config.data, field_name)
        if not path:
            continue
        try:
            real = Path(resolve(path)) if is_builtin(path) else Path(path)
        except FileNotFoundError as exc:
            problems.append(f"{where(f'data.{field_name}')}: data.{field_name}: {exc}")
            continue
        if not real.is_file():
            problems.append(
                f"{where(f'data.{field_name}')}: data.{field_name} = {path!r}: file not found "
                f"({real.resolve()}); relative paths are read from the working directory"
            )
    return problems


def check_plugin_choices(config: Config, registry: Registry) -> None:
    """Raise one ConfigError listing every plugin name or table that does not resolve."""
    problems = plugin_problems(config, registry)
    if problems:
        raise ConfigError(problems)


def resolve_config(config: Config, registry: Registry) -> list[str]:
    """What ``config check`` adds to loading: plugin names and tables (one ConfigError for
    all), then the data files, returned as warnings: a config is often checked before its
    data is downloaded, and ``train`` / ``eval`` name a missing file before any slow work."""
    check_plugin_choices(config, registry)
    return data_problems(config)
