"""config.toml: load a file, fill it, check it, and hand back a :class:`Config`.

The CLI calls :func:`load_config` once per command. It loads ``.env`` (next to the config file
and in the working directory; variables already set win), fills ``${VAR}`` placeholders,
checks every field against the schema and raises :class:`ConfigError` listing **all**
problems at once, each with the file and line where it can be found. With no file it loads
the embedded offline default (``searchr1/defaults/offline.toml``). Relative paths are
resolved against the working directory.

This module is the front door; the work is split by idea, and every public name of those
modules is importable from here (``from searchr1.core.config import Config, plugin_settings,
load_config``), which is the path the code, the tests and third-party plugins use:

* :mod:`searchr1.core.config_schema`: the sections as frozen dataclasses whose field
  metadata carries the checks and the ``secret`` flag; :class:`Config` with ``to_dict``
  (redacted) and ``replace``;
* :mod:`searchr1.core.config_validate`: :func:`check_table` (types, ranges, "did you mean"),
  the cross-field checks, and :func:`plugin_settings` for a plugin's own ``[section.name]``
  table (e.g. ``[search.zhihu]``);
* :mod:`searchr1.core.config_env`: ``.env`` loading and ``${VAR}`` interpolation, with the
  secrets they bring;
* :mod:`searchr1.core.config_values`: redaction by value and URL checks;
* :mod:`searchr1.core.config_advice`: what a file leaves unsaid (provider, protocol) and what
  the chosen provider cannot honour.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import tomli

from searchr1.core.config_advice import infer_choices, literal_secret_warnings
from searchr1.core.config_env import SECRET_FIELDS, interpolate, load_dotenv_files
from searchr1.core.config_schema import (
    REDACTED,
    SECTIONS,
    Config,
    DataConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SearchConfig,
    TrainConfig,
)
from searchr1.core.config_validate import (
    S,
    check_table,
    cross_checks,
    plugin_settings,
    unknown_name,
)
from searchr1.core.config_values import mask_secrets, secret_variable_values, url_problems
from searchr1.core.errors import ConfigError

DEFAULT_CONFIG_NAME = "offline.toml"
#: the name :func:`load_dotenv_files` had here before the split (``searchr1.api`` uses it)
_load_dotenv = load_dotenv_files

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "REDACTED",
    "SECTIONS",
    "Config",
    "ConfigError",
    "DataConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "S",
    "SearchConfig",
    "TrainConfig",
    "check_table",
    "default_config_text",
    "load_config",
    "parse_config",
    "plugin_settings",
]


def default_config_text() -> str:
    """The embedded offline default (also shipped as ``examples/offline.toml``)."""
    return resources.files("searchr1.defaults").joinpath(DEFAULT_CONFIG_NAME).read_text("utf-8")


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Load, interpolate and validate a config file (or the embedded default when ``path`` is
    None). ``env`` replaces ``os.environ`` (tests); otherwise ``.env`` files are loaded first."""
    if path is None:
        text, source, base = default_config_text(), "<embedded offline default>", Path.cwd()
    else:
        p = Path(path)
        if p.is_dir():
            raise ConfigError([f"{p}: is a folder; --config takes the config file itself"])
        if not p.is_file():
            raise ConfigError([f"{p}: config file not found (copy config.toml.example to start)"])
        text, source, base = _read_config_text(p), str(p), p.resolve().parent
        _reject_empty(text, source)
    notes: list[str] = []
    if env is None:
        notes = load_dotenv_files(base)
        env = os.environ
    config = parse_config(text, source=source, env=env)
    return dataclasses.replace(config, warnings=(*notes, *config.warnings)) if notes else config


def _read_config_text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 raise a ConfigError naming the line (a
    leading UTF-8 byte-order mark, as some Windows editors write, is dropped)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [
                f"{path}:{line}: the file is not UTF-8 text (byte {data[exc.start]:#04x} at "
                f"offset {exc.start}, line {line}); save it as UTF-8 (TOML files must be UTF-8)"
            ]
        ) from None


def _reject_empty(text: str, source: str) -> None:
    """An empty file (or only comments) configures nothing: every field would take its schema
    default, which is not a runnable setup, so say so rather than fail later elsewhere."""
    try:
        empty = not tomli.loads(text)
    except tomli.TOMLDecodeError:
        return  # parse_config reports the syntax error with its line
    if empty:
        raise ConfigError(
            [
                f"{source}: the config file is empty (no settings), so every field would take "
                f"its built-in schema default (model.provider = 'local' with base_model = "
                f"'builtin:tiny', search.provider = 'local' with no corpus, no data.train) - "
                f"that is not the offline demo and cannot train. Fill it in (config.toml.example "
                f"shows every setting), or run without this file to get the embedded offline "
                f"demo."
            ]
        )


def parse_config(text: str, *, source: str, env: Mapping[str, str]) -> Config:
    """Validate TOML text. Raises ConfigError with every problem found."""
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML: {exc}"]) from exc

    lines = _key_lines(text)
    problems: list[str] = []

    def where(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{source}:{line}" if line else source

    secrets: set[str] = set()
    variables: dict[str, str] = {}
    secrets.update(secret_variable_values(raw, "", env, SECRET_FIELDS))
    raw = interpolate(raw, "", env, problems, where, secrets, variables)
    explicit = frozenset(
        f"{s}.{k}" for s, t in raw.items() if isinstance(t, dict) for k in t if s in SECTIONS
    )
    choices = infer_choices(raw, where)

    sections: dict[str, Any] = {}
    plugins: dict[str, dict[str, Any]] = {}
    for key in raw:
        if key not in SECTIONS:
            problems.append(unknown_name(where(key), key, key, list(SECTIONS), "section"))
    for section, cls in SECTIONS.items():
        table = raw.get(section, {})
        if not isinstance(table, dict):
            problems.append(f"{where(section)}: {section} must be a table ([{section}])")
            table = {}
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in table.items():
            if key not in known and isinstance(value, dict):
                plugins[f"{section}.{key}"] = value
        values = check_table(
            {k: v for k, v in table.items() if k in known or not isinstance(v, dict)},
            cls,
            section,
            problems,
            where,
        )
        for f in dataclasses.fields(cls):
            if f.metadata.get("secret"):
                value = values.get(f.name, "")
                secrets.update([value] if isinstance(value, str) else value)
        sections[section] = cls(**values)

    if not problems:
        cross_checks(sections, problems, where)
    problems.extend(url_problems(raw, where))
    if problems:
        # A message may quote a value that holds a secret (a key inside a URL).
        raise ConfigError([mask_secrets(p, secrets) for p in problems])
    literal = {
        f"{section}.{f.name}": getattr(sections[section], f.name)
        for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("secret")
    }
    return Config(
        **sections,
        plugins=plugins,
        source=source,
        secrets=frozenset(s for s in secrets if s),
        variables=variables,
        choices=choices,
        warnings=tuple(literal_secret_warnings(literal, variables, where)),
        explicit=explicit,
    )


def _key_lines(text: str) -> dict[str, int]:
    """Map ``section.key`` (and ``section``) to its 1-based line number in the TOML text."""
    lines: dict[str, int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[+\s*([^\]]+?)\s*\]+", stripped)
        if header:
            section = header.group(1).replace(" ", "")
            lines.setdefault(section, number)
            continue
        key = re.match(r"^([A-Za-z0-9_\-\"']+)\s*=", stripped)
        if key:
            name = key.group(1).strip("\"'")
            lines.setdefault(f"{section}.{name}" if section else name, number)
    return lines
