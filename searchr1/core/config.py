"""config.toml: load, fill ``${VAR}``, check, and return a :class:`Config`.

:func:`load_config` loads ``.env`` (next to the config and in the working directory; set
variables win unless exported but empty) and raises :class:`ConfigError` listing **all**
problems with file and line. No file: the embedded offline default
(``searchr1/defaults/offline.toml``). Relative paths resolve against the working directory.

Secrets (values from secret-named variables, ``*_KEY(S)``, ``*_TOKEN``, ...; plugin fields
marked ``secret``) collect in :attr:`Config.secrets`, masked by value wherever they reappear
(logs, errors, ``to_dict``). Schema: :mod:`searchr1.core.config_schema`; checks:
:mod:`searchr1.core.config_validate`."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli

from searchr1.core.config_schema import (
    SECRET_KEY_RE,
    SECTIONS,
    Config,
    mask_secrets,
)
from searchr1.core.config_validate import (
    check_table,
    cross_checks,
    declared_settings,
    infer_choices,
    key_lines,
    literal_secret_warnings,
    secret_variable_names,
    section_extras,
    shared_secret_fields,
    unknown_name,
    url_problems,
)
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import installed_registry

if TYPE_CHECKING:
    from searchr1.core.plugins import Registry

DEFAULT_CONFIG_NAME = "offline.toml"


def default_config_text() -> str:
    """The embedded offline default (also shipped as ``examples/offline.toml``)."""
    return resources.files("searchr1.defaults").joinpath(DEFAULT_CONFIG_NAME).read_text("utf-8")


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Load, interpolate and validate ``path`` (None: the embedded default). ``env``
    replaces ``os.environ`` (tests); otherwise ``.env`` files are loaded first."""
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
    """The text; non-UTF-8 bytes raise a ConfigError naming the line (a BOM is dropped)."""
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
    """An empty file would run on schema defaults, which is no runnable setup: say so."""
    try:
        empty = not tomli.loads(text)
    except tomli.TOMLDecodeError:
        return  # parse_config reports the syntax error with its line
    if empty:
        raise ConfigError(
            [
                f"{source}: the config file is empty (no settings), so every field would take "
                f"its built-in schema default (the default model provider with base_model = "
                f"'builtin:tiny', the default search provider with no corpus, no data.train) - "
                f"that is not the offline demo and cannot train. Fill it in (config.toml.example "
                f"shows every setting), or run without this file to get the embedded offline "
                f"demo."
            ]
        )


def parse_config(
    text: str, *, source: str, env: Mapping[str, str], registry: Registry | None = None
) -> Config:
    """Validate TOML text, raising ConfigError with every problem. ``registry``: the
    installed plugins when None."""
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML: {exc}"]) from exc
    registry = registry or installed_registry()

    lines = key_lines(text)
    problems: list[str] = []

    def where(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{source}:{line}" if line else source

    secrets: set[str] = set()
    variables: dict[str, str] = {}
    secret_fields = shared_secret_fields(registry)
    secrets.update(secret_variable_values(raw, "", env, secret_fields))
    raw = interpolate(raw, "", env, problems, where, secrets, variables)
    explicit = frozenset(
        f"{s}.{k}" for s, t in raw.items() if isinstance(t, dict) for k in t if s in SECTIONS
    )
    moved = _stage_tables(raw, where)
    choices = infer_choices(raw, registry, where, problems)
    extras = section_extras(raw, registry, where, problems)

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
        mine = extras.get(section, {})
        values = check_table(
            {
                k: v
                for k, v in table.items()
                if (k in known or not isinstance(v, dict)) and k not in mine
            },
            cls,
            section,
            problems,
            where,
        )
        sections[section] = cls(**values)

    if not problems:
        cross_checks(sections, problems, where)
    problems.extend(url_problems(raw, where))
    found = _plugin_secrets(extras, plugins, secret_fields)
    for value in found.values():
        secrets.update(_secret_parts(value))
    if problems:
        # A message may quote a value that holds a secret (a key inside a URL).
        raise ConfigError([mask_secrets(p, secrets) for p in problems])
    names = secret_variable_names(raw, registry)
    _alias_variables(variables, extras, raw, registry)
    return Config(
        **sections,
        plugins=plugins,
        section_extras=extras,
        source=source,
        secrets=frozenset(s for s in secrets if s),
        variables=variables,
        choices=choices,
        warnings=(
            *literal_secret_warnings(found, variables, where, names),
            *moved,
            *_unused_names(sections["train"], explicit, where),
        ),
        explicit=explicit,
    )


#: what ``[train] stages`` and ``monitors`` listed by default, all of it now run by ``train``
#: whenever its own settings ask
_BUILT_IN = {
    "stages": ("heldout_eval", "ceiling", "cold_start"),
    "monitors": ("health", "run_notices"),
}


def _unused_names(train: Any, explicit: frozenset[str], where: Any) -> list[str]:
    """A warning per written ``[train] stages``/``monitors`` list: a name in it does nothing,
    and leaving a built-in one out no longer turns it off."""
    out = []
    for key, built_in in _BUILT_IN.items():
        listed = getattr(train, key)
        unknown = [name for name in listed if name not in built_in]
        left_out = [name for name in built_in if name not in listed]
        if f"train.{key}" not in explicit or not (unknown or left_out):
            continue
        parts = [f"lists {', '.join(map(repr, unknown))}, which does nothing"] if unknown else []
        if left_out:
            parts.append(f"leaves out {', '.join(map(repr, left_out))} (run anyway)")
        out.append(
            f"{where(f'train.{key}')}: train.{key} {' and '.join(parts)}: train runs the "
            f"held-out eval, cold start and health checks when their own settings ask "
            f"([train] eval_before_after, [train.cold_start] steps, [train.health]) and no "
            f"other stage or monitor; remove the key"
        )
    return out


def _stage_tables(raw: dict[str, Any], where: Any) -> list[str]:
    """Read a top-level ``[cold_start]`` table as ``[train.cold_start]`` and say so; with both
    tables the top-level one stays an unknown section."""
    out = []
    for name in ("cold_start",):
        if name in SECTIONS or not isinstance(raw.get(name), dict):
            continue
        train = raw.setdefault("train", {})
        if isinstance(train, dict) and name not in train:
            train[name] = raw.pop(name)
            out.append(f"{where(name)}: [{name}] is read as [train.{name}]; rename the table")
    return out


def _plugin_secrets(
    extras: Mapping[str, Mapping[str, Any]],
    plugins: Mapping[str, Mapping[str, Any]],
    secret_fields: frozenset[str],
) -> dict[str, Any]:
    """``dotted place -> value`` of every secret a plugin reads (section or plugin table)."""
    found: dict[str, Any] = {}
    for section, table in extras.items():
        for key, value in table.items():
            if f"{section}.{key}" in secret_fields:
                found[f"{section}.{key}"] = value
    for prefix, table in plugins.items():
        for key, value in table.items():
            dotted = f"{prefix}.{key}"
            if dotted in secret_fields or (SECRET_KEY_RE.match(key) and isinstance(value, str)):
                found[dotted] = value
    return found


def _secret_parts(value: Any) -> set[str]:
    """A secret value and, for a list or a comma/newline separated string, each part."""
    items = value if isinstance(value, list | tuple) else [value]
    out: set[str] = set()
    for item in items:
        if isinstance(item, str) and item.strip():
            out.add(item)
            out.update(p.strip() for p in re.split(r"[,\n]", item) if p.strip())
    return out


def _alias_variables(
    variables: dict[str, str],
    extras: Mapping[str, Mapping[str, Any]],
    raw: Mapping[str, Any],
    registry: Registry,
) -> None:
    """Record a section-table setting's variable under the chosen plugin's table too
    (``model.api_key`` -> ``model.<provider>.api_key``), where the plugin looks it up."""
    from searchr1.core.plugins import KINDS

    for kind, (_, field_name) in KINDS.items():
        section, _, key = field_name.partition(".")
        table = raw.get(section)
        chosen = table.get(key) if isinstance(table, dict) else None
        reg = registry.entries[kind].get(chosen) if isinstance(chosen, str) else None
        if reg is None:
            continue
        for name in extras.get(section, {}):
            var = variables.get(f"{section}.{name}")
            for table_name in declared_settings(reg):
                if var:
                    variables.setdefault(f"{section}.{table_name}.{name}", var)


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: a secret variable name: a KEY(S)/TOKEN/PASSWORD part or SECRET/PASSWORD anywhere. Parts,
#: not substrings: ``MAX_TOKENS`` is no secret (masking "2048" would blank every 2048 logged)
_SECRET_VAR_RE = re.compile(
    r"(?:^|_)(?:API_?)?(?:KEYS?|TOKEN|PASS|PASSWD)(?:_|$)|SECRET|PASSWORD", re.IGNORECASE
)


def interpolate(
    value: Any,
    dotted: str,
    env: Mapping[str, str],
    problems: list[str],
    where: Any,
    secrets: set[str],
    variables: dict[str, str],
) -> Any:
    """``value`` with ``${VAR}`` filled from ``env``; records secrets and which variable
    filled each dotted field."""
    if isinstance(value, dict):
        return {
            k: interpolate(
                v, f"{dotted}.{k}" if dotted else k, env, problems, where, secrets, variables
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [interpolate(v, dotted, env, problems, where, secrets, variables) for v in value]
    if not isinstance(value, str):
        return value

    def fill(match: re.Match[str]) -> str:
        var = match.group(1)
        variables.setdefault(dotted, var)
        got = env.get(var, "")
        if not got.strip():
            if var not in env:
                state, fix = "is not set", "set it in the environment or in a .env file"
            else:
                state = "is exported but empty"
                fix = f"export a value, or `unset {var}` and put {var}=... in a .env file"
            problems.append(
                f"{where(dotted)}: {dotted} needs environment variable {var}, which {state}; "
                f"{fix} next to the config"
            )
            return ""
        if _SECRET_VAR_RE.search(var):
            secrets.update(_secret_parts(got))
        return got

    return _VAR_RE.sub(fill, value)


def load_dotenv_files(config_dir: Path) -> list[str]:
    """Load ``.env`` files into ``os.environ`` (set variables win) and return warnings. An
    exported but **empty** variable is filled from ``.env`` with a warning: it is almost
    always a leftover ``export VAR=`` silently shadowing the file's key."""
    from dotenv import dotenv_values, load_dotenv

    warnings: list[str] = []
    for folder in dict.fromkeys([config_dir, Path.cwd()]):
        env_file = folder / ".env"
        if env_file.is_file():
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
                    [
                        f"{env_file}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it "
                        f"as UTF-8"
                    ]
                ) from None
    return warnings


def secret_variable_values(
    value: Any, dotted: str, env: Mapping[str, str], secret_fields: frozenset[str]
) -> set[str]:
    """Resolved values of every ``${VAR}`` feeding a secret field, also split at commas
    and newlines, so each key is masked wherever it reappears."""
    if isinstance(value, dict):
        found: set[str] = set()
        for k, v in value.items():
            found |= secret_variable_values(v, f"{dotted}.{k}" if dotted else k, env, secret_fields)
        return found
    if isinstance(value, list):
        return {s for v in value for s in secret_variable_values(v, dotted, env, secret_fields)}
    if not isinstance(value, str):
        return set()
    key = dotted.rsplit(".", 1)[-1]
    in_plugin_table = dotted.count(".") >= 2
    if dotted not in secret_fields and not (in_plugin_table and SECRET_KEY_RE.match(key)):
        return set()
    found = set()
    for var in _VAR_RE.findall(value):
        found |= _secret_parts(env.get(var, "").strip())
    return found
