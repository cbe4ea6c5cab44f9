"""config.toml: load, fill ``${VAR}``, check, and return a :class:`Config`.

:func:`load_config` loads ``.env`` (next to the config and in the working directory; set
variables win unless exported but empty) and raises :class:`ConfigError` listing **all**
problems with file and line. No file: the embedded offline default
(``searchr1/defaults/offline.toml``). Relative paths resolve against the working directory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.config_schema import SECTIONS, Config
from searchr1.core.config_validate import (
    check_table,
    cross_checks,
    infer_choices,
    key_lines,
    plugin_problems,
    unknown_name,
    url_problem,
)
from searchr1.core.errors import ConfigError
from searchr1.core.secrets import is_secret_name, redact_text, secret_parts

if TYPE_CHECKING:
    from searchr1.core.plugins import Registry


def default_config_text() -> str:
    """The embedded offline default (also shipped as ``examples/offline.toml``)."""
    return resources.files("searchr1.defaults").joinpath("offline.toml").read_text("utf-8")


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    registry: Registry,
    env: Mapping[str, str] | None = None,
    check_plugins: bool = False,
) -> Config:
    """Load, interpolate and validate ``path`` (None: the embedded default) against the
    run's plugins ``registry``. ``env`` replaces ``os.environ`` (tests); otherwise ``.env``
    files are loaded first. ``check_plugins``: see :func:`parse_config`."""
    if path is None:
        text, source, base = default_config_text(), "<embedded offline default>", Path.cwd()
    else:
        p = Path(path)
        if p.is_dir():
            raise ConfigError([f"{p}: is a folder; --config takes the config file itself"])
        if not p.is_file():
            raise ConfigError([f"{p}: config file not found (copy config.toml.example to start)"])
        source, base, data = str(p), p.resolve().parent, p.read_bytes()
        try:
            text = data.decode("utf-8-sig")  # a BOM is dropped
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise ConfigError(
                [
                    f"{p}:{line}: the file is not UTF-8 text (byte {data[exc.start]:#04x} at "
                    f"offset {exc.start}, line {line}); save it as UTF-8 (TOML files must be UTF-8)"
                ]
            ) from None
        if not re.sub(r"(?m)^\s*(#.*)?$", "", text).strip():  # only blanks and comments
            raise ConfigError(
                [
                    f"{source}: the config file has no settings, so every field would take its "
                    f"schema default, which cannot train (no data.train). Fill it in "
                    f"(config.toml.example shows every setting), or run without this file to "
                    f"get the embedded offline demo."
                ]
            )
    notes = load_dotenv_files(base) if env is None else []
    env = os.environ if env is None else env
    config = parse_config(
        text, source=source, env=env, registry=registry, check_plugins=check_plugins
    )
    return dataclasses.replace(config, warnings=(*notes, *config.warnings))


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_config(
    text: str,
    *,
    source: str,
    env: Mapping[str, str],
    registry: Registry,
    check_plugins: bool = False,
) -> Config:
    """Validate TOML text against the run's plugins ``registry``, raising ConfigError with
    every problem. ``check_plugins``: the plugin names and tables too
    (:func:`~searchr1.core.config_validate.plugin_problems`), every problem in one error in
    file order; otherwise a run checks them when it opens."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML: {exc}"]) from exc
    lines = key_lines(text)
    where = Config(source=source, lines=lines).where
    problems: list[str] = []
    filled = _Interpolation(env, where, _secret_test(registry), problems)
    raw = filled.fill_in(raw, "")
    _check_sections(raw, where, problems)
    explicit = frozenset(f"{s}.{k}" for s in SECTIONS for k in raw.get(s, {}))
    choices, names = infer_choices(raw, registry, where, problems)
    sections, plugins = _sections(raw, where, problems)
    _cross_check(sections, where, problems)
    warnings = list(dict.fromkeys(filled.trimmed))
    warnings += _check_values(filled, names, where, problems)
    config = Config(
        **sections,
        plugins=plugins,
        source=source,
        secrets=frozenset(filled.secrets),
        variables=filled.variables,
        choices=choices,
        warnings=tuple(warnings),
        explicit=explicit,
        lines=lines,
        assets=registry.assets,
    )
    if check_plugins:  # on the values that passed (a bad one stands at its default)
        problems += plugin_problems(config, registry)
    if problems:
        # A message may quote a value that holds a secret (a key inside a URL).
        line = re.compile(rf"^{re.escape(source)}:(\d+):")  # in file order; a whole-file one first
        problems.sort(key=lambda p: int(m.group(1)) if (m := line.match(p)) else 0)
        raise ConfigError([redact_text(p, filled.secrets) for p in problems])
    return config


def _secret_test(registry: Registry) -> Callable[[str], bool]:
    """Whether a dotted field holds a secret: a secret-named key (every secret field of the
    schema has one), or a field some plugin declares secret."""
    declared = {
        f.name
        for kind in registry.entries.values()
        for r in kind.values()
        for cls in r.settings.values()
        for f in dataclasses.fields(cls)
        if f.metadata.get("secret")
    }

    def is_secret(dotted: str) -> bool:
        name = dotted.rpartition(".")[2]
        return name in declared or is_secret_name(name)

    return is_secret


class _Interpolation:
    """Fills each ``${VAR}`` from ``env``, keeping what a config needs of it: the variable that
    filled each dotted field, the secret values seen, every non-table value by its dotted place,
    and warnings for values with whitespace around them. A missing variable is a problem."""

    def __init__(
        self,
        env: Mapping[str, str],
        where: Callable[[str], str],
        is_secret: Callable[[str], bool],
        problems: list[str],
    ) -> None:
        self.env, self.where, self.is_secret, self.problems = env, where, is_secret, problems
        self.secrets: set[str] = set()
        self.variables: dict[str, str] = {}
        self.leaves: dict[str, Any] = {}
        self.trimmed: list[str] = []

    def fill_in(self, value: Any, dotted: str) -> Any:
        if isinstance(value, dict):
            return {k: self.fill_in(v, f"{dotted}.{k}" if dotted else k) for k, v in value.items()}
        if isinstance(value, list):
            value = [self.fill_in(v, dotted) for v in value]
        elif isinstance(value, str):
            value = _VAR_RE.sub(lambda match: self._fill(match.group(1), dotted), value)
        self.leaves[dotted] = value
        return value

    def _fill(self, var: str, dotted: str) -> str:
        self.variables.setdefault(dotted, var)
        got = self.env.get(var, "")
        if not got.strip():
            if var not in self.env:
                state, fix = "is not set", "set it in the environment or in a .env file"
            else:
                state = "is exported but empty"
                fix = f"export a value, or `unset {var}` and put {var}=... in a .env file"
            self.problems.append(
                f"{self.where(dotted)}: {dotted} needs environment variable {var}, which "
                f"{state}; {fix} next to the config"
            )
            return ""
        if is_secret_name(var) or self.is_secret(dotted):
            self.secrets.update(secret_parts(got.strip()))
        if got != got.strip():  # a pasted key's newline would end up in a header
            self.trimmed.append(
                f"{self.where(dotted)}: {dotted}: environment variable {var} has spaces or a "
                f"line break around its value; they are left out"
            )
        return got.strip()


def _check_sections(raw: dict[str, Any], where: Callable[[str], str], problems: list[str]) -> None:
    """Every top-level key names a section and holds a table (a bad one is emptied)."""
    for key, table in list(raw.items()):
        if key not in SECTIONS:
            problems.append(unknown_name(where(key), key, key, list(SECTIONS), "section"))
        elif not isinstance(table, dict):
            problems.append(f"{where(key)}: {key} must be a table ([{key}])")
            raw[key] = {}


def _sections(
    raw: dict[str, Any], where: Callable[[str], str], problems: list[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Each section's checked dataclass, and the plugin tables (``section.name``) inside them."""
    sections: dict[str, Any] = {}
    plugins: dict[str, dict[str, Any]] = {}
    for section, cls in SECTIONS.items():
        table = raw.get(section, {})
        known = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in table.items() if k in known or not isinstance(v, dict)}
        plugins.update({f"{section}.{k}": v for k, v in table.items() if k not in own})
        sections[section] = cls(**check_table(own, cls, section, problems, where))
    return sections, plugins


def _cross_check(
    sections: dict[str, Any], where: Callable[[str], str], problems: list[str]
) -> None:
    """Cross-field rules, except those naming a field whose own value was refused (it stands
    at its default here, so the rule would judge a value nobody wrote)."""
    refused = {m.group(1) for p in problems if (m := re.match(r"^.*?: ([a-z_]+\.[a-z_]+) ", p))}
    crossed: list[str] = []
    cross_checks(sections, crossed, where)
    problems += [p for p in crossed if not any(name in p for name in refused)]


def _check_values(
    filled: _Interpolation,
    names: Mapping[str, str],
    where: Callable[[str], str],
    problems: list[str],
) -> list[str]:
    """Check every value's URL and collect the secrets written in the file; return a warning
    for each literal secret (``names``: the variable a plugin suggests for a field)."""
    warnings: list[str] = []
    for dotted, value in filled.leaves.items():
        bad_url = url_problem(dotted, value)
        if bad_url:
            problems.append(f"{where(dotted)}: {dotted} = {value!r} {bad_url}")
        found = secret_parts(value) if filled.is_secret(dotted) else set()
        filled.secrets |= found
        if found and dotted not in filled.variables:
            var = names.get(dotted) or dotted.replace(".", "_").upper()
            section, key = dotted.rsplit(".", 1)
            warnings.append(
                f"{where(dotted)}: {dotted} holds a literal secret: a config file is easy to "
                f'commit and share. Write [{section}] {key} = "${{{var}}}" and put {var}=... '
                f"in a .env file next to the config (never committed)"
            )
    return warnings


def load_dotenv_files(config_dir: Path) -> list[str]:
    """Load ``.env`` files into ``os.environ`` (set variables win) and return warnings. An
    exported but **empty** variable is filled from ``.env`` with a warning: it is almost
    always a leftover ``export VAR=`` silently shadowing the file's key."""
    from dotenv import dotenv_values, load_dotenv

    warnings: list[str] = []
    for env_file in dict.fromkeys([config_dir / ".env", Path.cwd() / ".env"]):
        if not env_file.is_file():
            continue
        try:
            for name, value in dotenv_values(env_file).items():
                if value and os.environ.get(name) == "":
                    os.environ[name] = value
                    warnings.append(
                        f"{name} is exported but empty in the environment; using its value "
                        f"from {env_file} (run `unset {name}` to silence this)"
                    )
            load_dotenv(env_file, override=False)
        except UnicodeDecodeError as exc:
            raise ConfigError(
                [f"{env_file}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"]
            ) from None
    return warnings
