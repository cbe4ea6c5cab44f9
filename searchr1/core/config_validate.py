"""Checking a config: tables against their schema, cross-field rules, and what plugins declare
(``docs/plugins.md``, "What a factory may declare").

Every problem is appended to a list so the user sees all of them in one
:class:`~searchr1.core.errors.ConfigError`, each prefixed by file and line. A field's checks
come from its metadata (:mod:`searchr1.core.config_schema`): ``min``/``max``/``gt``/``lt``/
``choices``, ``nonempty``/``unique``/``length``/``unit_interval``, ``inf_ok``; ``split`` lets a
``tuple[...]`` field take a comma or newline separated string."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.core.config_schema import REDACTED, SECTIONS, Config, mask_secrets
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import CHOSEN_BY_LIST, KINDS, installed_registry

if TYPE_CHECKING:
    from searchr1.core.plugins import Registration, Registry

#: a plugin's settings dataclass (see :func:`plugin_settings`)
S = TypeVar("S")


def check_table(
    table: Mapping[str, Any],
    cls: type,
    section: str,
    problems: list[str],
    where: Any = None,
) -> dict[str, Any]:
    """Check one table against a dataclass schema; append problems, return coerced values."""
    where = where or (lambda dotted: section)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{section}.{key}"
        f = fields.get(key)
        if f is None:
            problems.append(unknown_name(where(dotted), dotted, key, list(fields), "key"))
            continue
        coerced, error = _coerce(value, hints[key], f.metadata)
        if error:
            problems.append(f"{where(dotted)}: {dotted} {error}")
            continue
        error = _check_range(coerced, f.metadata)
        if error:
            shown = REDACTED if f.metadata.get("secret") else repr(value)
            problems.append(f"{where(dotted)}: {dotted} = {shown} {error}")
            continue
        values[key] = coerced
    return values


def plugin_settings(
    config: Config,
    section: str,
    name: str,
    cls: type[S],
    checks: Callable[[S], Iterable[str]] | None = None,
) -> S:
    """A plugin's ``[section.name]`` table as a ``cls`` instance, checked by
    :func:`check_table` (a bad value falls back to its default) and ``checks``; all problems
    raise at once in one :class:`ConfigError`. An ``also_in_section`` field is also read from
    the section's own table when this table lacks it."""
    problems: list[str] = []
    shared = shared_fields(cls)
    extras = config.section_extras.get(section, {})
    table = {k: v for k, v in extras.items() if k in shared}
    table.update(config.plugin_table(section, name))
    values = check_table(table, cls, f"{section}.{name}", problems, lambda _: config.source)
    settings = cls(**values)
    if checks is not None:
        problems.extend(f"{config.source}: {problem}" for problem in checks(settings))
    if problems:
        raise ConfigError(problems)
    return settings


def unknown_name(loc: str, dotted: str, key: str, known: list[str], what: str) -> str:
    hint = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(known)}"
    return f"{loc}: unknown {what} {dotted!r}{suggestion}"


def _coerce(value: Any, hint: Any, meta: Mapping[str, Any]) -> tuple[Any, str | None]:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_type, _) = typing.get_args(hint)
        if isinstance(value, tuple):  # set through Config.replace rather than a file
            value = list(value)
        if isinstance(value, str) and meta.get("split"):
            value = [v.strip() for v in re.split(r"[,\n]", value) if v.strip()]
        if not isinstance(value, list):
            return None, f"must be a list of {item_type.__name__}, got {type(value).__name__}"
        out = []
        for item in value:
            coerced, error = _coerce(item, item_type, {})
            if error:
                return None, f"items {error}"
            out.append(coerced)
        return tuple(out), None
    if origin in (typing.Union, types.UnionType):
        return value, None
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -(2**63) <= value < 2**63:
            # TOML integers are 64-bit; torch and numpy overflow on anything larger
            return None, f"must fit in 64 bits, got {value}"
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
        if ok and not math.isfinite(value) and not (math.isinf(value) and meta.get("inf_ok")):
            # nan passes every comparison (nan < 0 is False), so no range check would catch it
            return None, f"must be a finite number, got {value}"
    elif hint is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        return None, f"must be {hint.__name__}, got {type(value).__name__} {value!r}"
    return value, None


def _check_range(value: Any, meta: Mapping[str, Any]) -> str | None:
    if "choices" in meta and value not in meta["choices"]:
        return f"is not one of {', '.join(map(repr, meta['choices']))}"
    if "each_choice" in meta:
        bad = [v for v in value if v not in meta["each_choice"]]
        if bad:
            names = ", ".join(map(repr, meta["each_choice"]))
            return f"has {', '.join(map(repr, bad))}, not one of {names}"
    if "min" in meta and value < meta["min"]:
        return f"must be >= {meta['min']}"
    if "max" in meta and value > meta["max"]:
        return f"must be <= {meta['max']}"
    if "gt" in meta and not value > meta["gt"]:
        return f"must be > {meta['gt']}"
    if "lt" in meta and not value < meta["lt"]:
        return f"must be < {meta['lt']}"
    if meta.get("nonempty") and not value:
        return "must not be empty"
    if meta.get("unique"):
        if any(not v.strip() for v in value):
            return "must not contain an empty name"
        repeated = sorted({v for v in value if value.count(v) > 1})
        if repeated:
            return f"lists {', '.join(map(repr, repeated))} more than once"
    if "length" in meta and len(value) != meta["length"]:
        return f"must have exactly {meta['length']} values"
    if meta.get("unit_interval") and not all(0.0 <= v < 1.0 for v in value):
        return "values must be in [0, 1)"
    return None


def cross_checks(s: dict[str, Any], problems: list[str], where: Any) -> None:
    rollout, train = s["rollout"], s["train"]
    smoke = s["smoke"]
    if smoke.question.strip() and not smoke.answers:
        problems.append(
            f"{where('smoke.question')}: smoke.question is set but smoke.answers is empty: "
            f'list the golden answers its rewards are scored against, e.g. answers = ["..."]'
        )
    if smoke.answers and not smoke.question.strip():
        problems.append(
            f"{where('smoke.answers')}: smoke.answers is set but smoke.question is empty: "
            f"name the question they answer (without both, smoke asks the reference setup's question)"
        )
    if rollout.max_trajectory_tokens > train.max_datum_tokens + 1:
        problems.append(
            f"{where('rollout.max_trajectory_tokens')}: rollout.max_trajectory_tokens "
            f"({rollout.max_trajectory_tokens}) must fit in one datum: raise "
            f"train.max_datum_tokens to at least {rollout.max_trajectory_tokens - 1} or lower it"
        )
    if train.max_datum_tokens > train.max_micro_batch_tokens:
        problems.append(
            f"{where('train.max_datum_tokens')}: train.max_datum_tokens "
            f"({train.max_datum_tokens}) must fit in one micro-batch: "
            f"train.max_micro_batch_tokens is {train.max_micro_batch_tokens}"
        )
    if s["model"].max_new_tokens > rollout.max_trajectory_tokens:
        problems.append(
            f"{where('model.max_new_tokens')}: model.max_new_tokens ({s['model'].max_new_tokens})"
            f" is larger than rollout.max_trajectory_tokens ({rollout.max_trajectory_tokens})"
        )


def url_problems(value: Any, where: Callable[[str], str], dotted: str = "") -> list[str]:
    """A URL field without an http(s) scheme or host, which would otherwise fail at the
    first request as a vague, retried "connection error"."""
    from urllib.parse import urlsplit

    if isinstance(value, dict):
        return [
            p
            for k, v in value.items()
            for p in url_problems(v, where, f"{dotted}.{k}" if dotted else k)
        ]
    key = dotted.rsplit(".", 1)[-1]
    if not isinstance(value, str) or not value.strip() or not _URL_KEY_RE.match(key):
        return []
    url = value.strip()
    parts = urlsplit(url)
    if "://" not in url:
        problem = f"has no scheme; write it as https://{url} (or http:// for a local server)"
    elif parts.scheme.lower() not in ("http", "https"):
        rest = url.split("://", 1)[1]
        problem = (
            f"has scheme {parts.scheme!r}; only http:// and https:// work "
            f"(did you mean https://{rest}?)"
        )
    elif not parts.hostname:
        problem = "has no host; write the whole address, e.g. https://example.com/api"
    else:
        return []
    return [f"{where(dotted)}: {dotted} = {value!r} {problem}"]


#: keys whose value is a URL: checked for an http(s) scheme and a host
_URL_KEY_RE = re.compile(r"^(?:api_base|base_url|url|.*_url)$")


# --------------------------------------------------------------------------- what plugins declare

#: the optional attributes of a registered factory that this module reads
FACTORY_ATTRIBUTES = (
    "settings",
    "infer_provider",
    "default",
    "defaults",
    "secret_variables",
    "advise",
)


def declared_settings(reg: Registration) -> dict[str, type]:
    """``table -> dataclass``: ``factory.settings`` is one dataclass (table
    ``[section.<name>]``) or such a mapping."""
    declared = getattr(reg.factory, "settings", None)
    if declared is None:
        return {}
    if isinstance(declared, Mapping):
        return dict(declared)
    return {reg.name: declared}


def shared_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields of a settings dataclass that may also be written in the section's table."""
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("also_in_section")}


def _chosen_kinds() -> dict[str, tuple[str, str]]:
    """``kind -> (section, key)`` for every kind chosen by one name (not a list)."""
    return {
        kind: tuple(field_name.split(".", 1))  # type: ignore[misc]
        for kind, (_, field_name) in KINDS.items()
        if "." in field_name and kind not in CHOSEN_BY_LIST
    }


def _claimers(registry: Registry, kind: str, section: str, key: str) -> list[tuple[str, str]]:
    """``(name, table)`` of every registration reading ``[section] key``."""
    return [
        (reg.name, table)
        for reg in registry.entries[kind].values()
        for table, cls in declared_settings(reg).items()
        if key in shared_fields(cls)
    ]


def shared_secret_fields(registry: Registry) -> frozenset[str]:
    """Dotted names of every secret a plugin may read from a section's own table
    (``model.api_key``) or its plugin table (``model.x.api_key``)."""
    out: set[str] = set()
    for kind, (section, _) in _chosen_kinds().items():
        for reg in registry.entries[kind].values():
            for table, cls in declared_settings(reg).items():
                if not dataclasses.is_dataclass(cls):
                    continue
                for f in dataclasses.fields(cls):
                    if f.metadata.get("secret"):
                        out.add(f"{section}.{table}.{f.name}")
                        if f.metadata.get("also_in_section"):
                            out.add(f"{section}.{f.name}")
    return frozenset(out)


def _label(kind: str, section: str) -> str:
    return "provider" if section == "model" else kind.replace("_", " ")


def infer_choices(
    raw: dict[str, Any], registry: Registry, where: Callable[[str], str], problems: list[str]
) -> dict[str, str]:
    """Fill in ``raw`` each omitted provider (the one whose ``infer_provider`` claims
    the table, else the ``default``), ``rollout.protocol``, and the chosen provider's
    ``factory.defaults``; return ``dotted field -> why`` (printed by config check)."""
    reasons: dict[str, str] = {}
    for kind, (section, key) in _chosen_kinds().items():
        if key != "provider":
            continue
        table = raw.get(section)
        table = table if isinstance(table, dict) else {}
        dotted = f"{section}.{key}"
        if key in table:
            if section == "model":
                reasons[dotted] = f"set in {where(dotted)}"
            continue
        name, why = _infer_provider(registry, kind, section, table, where, problems)
        if not name:
            continue
        if isinstance(raw.get(section), dict):
            raw[section][key] = name
        elif section not in raw:
            raw[section] = {key: name}
        reasons[dotted] = f"not set; {why}"
    rollout = raw.get("rollout")
    if isinstance(rollout, dict) and "protocol" in rollout:
        reasons["rollout.protocol"] = f"set in {where('rollout.protocol')}"
    else:
        reasons["rollout.protocol"] = (
            "not set; the default: the model calls the search tool through its chat template "
            "and ends with one `Answer: ...` line (the reference setup's format)"
        )
    _declared_defaults(raw, registry, where, reasons)
    return reasons


def _infer_provider(
    registry: Registry,
    kind: str,
    section: str,
    table: Mapping[str, Any],
    where: Callable[[str], str],
    problems: list[str],
) -> tuple[str, str]:
    claims = []
    for reg in registry.entries[kind].values():
        infer = getattr(reg.factory, "infer_provider", None)
        why = infer(dict(table)) if callable(infer) else None
        if why:
            claims.append((reg.name, str(why)))
    if len(claims) > 1:
        names = " and ".join(repr(n) for n, _ in claims)
        problems.append(
            f"{where(section)}: [{section}] sets no provider and the plugins of {names} each "
            f"claim it; write provider = ... in [{section}] to choose one"
        )
        return "", ""
    if claims:
        return claims[0]
    defaults = [
        (reg.name, str(reg.factory.default))
        for reg in registry.entries[kind].values()
        if getattr(reg.factory, "default", None)
    ]
    if len(defaults) == 1:
        name, why = defaults[0]
        return name, f"no installed plugin claims [{section}], so the default: {why}"
    if len(defaults) > 1:
        names = " and ".join(repr(n) for n, _ in defaults)
        problems.append(
            f"{where(section)}: [{section}] sets no provider and {names} are each declared the "
            f"default {kind.replace('_', ' ')}; write provider = ... in [{section}]"
        )
    else:
        problems.append(
            f"{where(section)}: [{section}] sets no provider and no installed plugin claims it "
            f"or is the default; write provider = ... (the `plugins` command lists them)"
        )
    return "", ""


def _declared_defaults(
    raw: dict[str, Any], registry: Registry, where: Callable[[str], str], reasons: dict[str, str]
) -> None:
    for kind, (section, key) in _chosen_kinds().items():
        table = raw.get(section)
        name = table.get(key) if isinstance(table, dict) else None
        reg = registry.entries[kind].get(name) if isinstance(name, str) else None
        declared = getattr(reg.factory, "defaults", None) if reg is not None else None
        for dotted, (value, why) in dict(declared or {}).items():
            target, _, field_name = dotted.partition(".")
            current = raw.get(target)
            if isinstance(current, dict) and field_name in current:
                continue
            if isinstance(current, dict):
                current[field_name] = value
            elif target not in raw:
                raw[target] = {field_name: value}
            else:
                continue
            reasons[dotted] = f"not set; {value} for {_label(kind, section)} {name!r}: {why}"
    train = raw.get("train")
    if isinstance(train, dict) and "max_staleness" in train:
        reasons.setdefault("train.max_staleness", f"set in {where('train.max_staleness')}")
    else:
        reasons.setdefault(
            "train.max_staleness",
            "not set; 0: synchronous steps (the model provider declares no other default)",
        )


def section_extras(
    raw: Mapping[str, Any], registry: Registry, where: Callable[[str], str], problems: list[str]
) -> dict[str, dict[str, Any]]:
    """Keys of a section's own table that no core field has and some plugin's settings
    read, each checked against the chosen plugin first. Unread keys are left to
    :func:`check_table` to name."""
    out: dict[str, dict[str, Any]] = {}
    for kind, (section, key) in _chosen_kinds().items():
        table = raw.get(section)
        if not isinstance(table, dict) or section not in SECTIONS:
            continue
        known = {f.name for f in dataclasses.fields(SECTIONS[section])}
        chosen = table.get(key)
        for name, value in table.items():
            if name in known or isinstance(value, dict):
                continue
            claimers = _claimers(registry, kind, section, name)
            if not claimers:
                continue
            claimers.sort(key=lambda c: c[0] != chosen)
            reg = registry.entries[kind][claimers[0][0]]
            cls = declared_settings(reg)[claimers[0][1]]
            values = check_table({name: value}, cls, section, problems, where)
            if name in values:
                out.setdefault(section, {})[name] = values[name]
    return out


def literal_secret_warnings(
    found: Mapping[str, Any],
    variables: Mapping[str, str],
    where: Callable[[str], str],
    names: Mapping[str, str],
) -> list[str]:
    """A warning per secret written literally, not as ``${VAR}``: ``found`` maps its
    dotted place to its value, ``names`` to its ``factory.secret_variables`` variable."""
    out = []
    for dotted, value in found.items():
        if not value or dotted in variables:
            continue
        var = names.get(dotted) or dotted.replace(".", "_").upper()
        section, key = dotted.rsplit(".", 1)
        out.append(
            f"{where(dotted)}: {dotted} holds a literal secret: a config file is easy to commit "
            f'and share. Write [{section}] {key} = "${{{var}}}" and put {var}=... in a .env '
            f"file next to the config (never committed)"
        )
    return out


def secret_variable_names(raw: Mapping[str, Any], registry: Registry) -> dict[str, str]:
    """``dotted secret -> variable`` a literal should move to (``factory.secret_variables``)."""
    out: dict[str, str] = {}
    for kind, (section, key) in _chosen_kinds().items():
        table = raw.get(section)
        name = table.get(key) if isinstance(table, dict) else None
        reg = registry.entries[kind].get(name) if isinstance(name, str) else None
        declared = getattr(reg.factory, "secret_variables", None) if reg is not None else None
        for field_name, var in dict(declared or {}).items():
            out[f"{section}.{field_name}"] = var
            out[f"{section}.{name}.{field_name}"] = var
    return out


def _chosen(config: Config, registry: Registry, kind: str, section: str, key: str) -> str:
    """The registered name the config chooses for ``kind`` (an empty name: the default)."""
    name = getattr(getattr(config, section), key, "")
    if name:
        return str(name)
    try:
        return registry.get(kind, "").name
    except Exception:  # noqa: BLE001 - no default: check_plugin_choices names the field
        return ""


def relocations(config: Config, registry: Registry) -> list[str]:
    """Where each setting written in a section's own table is read now (config check)."""
    out = []
    for kind, (section, key) in _chosen_kinds().items():
        chosen = _chosen(config, registry, kind, section, key)
        for name in config.section_extras.get(section, {}):
            for owner, table in _claimers(registry, kind, section, name):
                if owner == chosen:
                    out.append(
                        f"{section}.{name}: now [{section}.{table}] {name} (read from the old "
                        f"place)"
                    )
                    break
    return out


def advice(config: Config, registry: Registry | None = None) -> list[str]:
    """Warnings before the run: section settings the chosen provider does not read, and
    each chosen ``factory.advise(config)``. A failing ``advise`` is ignored: the load reports it."""
    registry = registry or installed_registry()
    out: list[str] = []
    for kind, (section, key) in _chosen_kinds().items():
        chosen = _chosen(config, registry, kind, section, key)
        for name in config.section_extras.get(section, {}):
            owners = sorted({owner for owner, _ in _claimers(registry, kind, section, name)})
            if owners and chosen not in owners:
                out.append(
                    f"{section}.{name} is ignored by {_label(kind, section)} {chosen!r} (a "
                    f"setting of {', '.join(map(repr, owners))}); remove it, or choose one of "
                    f"those as [{section}] provider"
                )
    for kind, (section, key) in _chosen_kinds().items():
        reg = registry.entries[kind].get(_chosen(config, registry, kind, section, key))
        advise = getattr(reg.factory, "advise", None) if reg is not None else None
        if not callable(advise):
            continue
        try:
            out.extend(str(line) for line in advise(config))
        except Exception:  # noqa: BLE001 - the factory's own load names the problem
            continue
    return out


# --------------------------------------------------------------------------- names and files

#: plugin tables that belong to a section although no plugin is registered under that name
FIXED_TABLES: dict[str, frozenset[str]] = {"train": frozenset({"loss", "cold_start", "health"})}


def key_lines(text: str) -> dict[str, int]:
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


def locator(config: Config) -> Callable[[str], str]:
    """``where(dotted) -> "file:line"`` (just the source when not from a readable file)."""
    try:
        lines = key_lines(Path(config.source).read_text("utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        lines = {}

    def where(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{config.source}:{line}" if line else config.source

    return where


def _named_choices(config: Config, registry: Registry) -> list[tuple[str, str, list[str], Any]]:
    """``(kind, dotted field, registered names, value)`` for every kind's config field."""
    out = []
    for kind, (_, field_name) in KINDS.items():
        section, _, key = field_name.partition(".")
        value = getattr(getattr(config, section, None), key, None)
        out.append((kind, field_name, registry.names(kind), value))
    return out


def plugin_problems(config: Config, registry: Registry) -> list[str]:
    """A "did you mean" line per unregistered plugin name or unowned ``[section.name]``."""
    where = locator(config)
    problems: list[str] = []
    tables: dict[str, set[str]] = {}
    for kind, field_name, names, chosen in _named_choices(config, registry):
        section = field_name.partition(".")[0]
        tables.setdefault(section, set()).update(names)
        for name in chosen if isinstance(chosen, list | tuple) else [chosen]:
            if not isinstance(name, str) or not name or name in names:
                continue  # an empty name is left to whoever infers or rejects it
            problems.append(_not_installed(where(field_name), field_name, name, kind, names))
    problems += _chosen_settings_problems(config, registry, where)
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


def _not_installed(loc: str, dotted: str, name: str, kind: str, names: list[str]) -> str:
    hint = difflib.get_close_matches(name, names, n=1)
    mean = f"did you mean {hint[0]!r}? " if hint else ""
    return (
        f"{loc}: {dotted} = {name!r}: no {kind.replace('_', ' ')} of that name is installed; "
        f"{mean}installed: {', '.join(names) or '(none)'} (the `plugins` command lists them)"
    )


def _chosen_settings_problems(config: Config, registry: Registry, where: Any) -> list[str]:
    """Each chosen plugin's declared settings tables, and ``[train.cold_start]`` and
    ``[train.health]``, checked like the core's own sections (unknown keys, types, ranges),
    and a field naming a plugin (metadata ``names=KIND``)
    checked against the registry, so ``config check`` finds them before any run."""
    from searchr1.core.config_schema import ColdStartSettings, HealthSettings

    out: list[str] = []
    core_tables = [("train", {"cold_start": ColdStartSettings, "health": HealthSettings})]
    for kind, field_name, _, chosen in _named_choices(config, registry):
        section = field_name.partition(".")[0]
        for name in chosen if isinstance(chosen, list | tuple) else [chosen]:
            reg = registry.entries[kind].get(name) if isinstance(name, str) else None
            if reg:
                core_tables.append((section, declared_settings(reg)))
    for section, declared in core_tables:
        for table, cls in declared.items():
            if not dataclasses.is_dataclass(cls):
                continue
            prefix = f"{section}.{table}"
            values = check_table(config.plugin_table(section, table), cls, prefix, out, where)
            for f in dataclasses.fields(cls):
                wanted, value = f.metadata.get("names"), values.get(f.name, f.default)
                if wanted and isinstance(value, str) and value not in registry.names(wanted):
                    dotted = f"{prefix}.{f.name}"
                    out.append(
                        _not_installed(where(dotted), dotted, value, wanted, registry.names(wanted))
                    )
    return [mask_secrets(p, config.secrets) for p in out]


def check_plugin_choices(config: Config, registry: Registry) -> None:
    """Raise one ConfigError listing every plugin name or table that does not resolve."""
    problems = plugin_problems(config, registry)
    if problems:
        raise ConfigError(problems)
