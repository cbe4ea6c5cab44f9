"""Checking a config: tables against their schema, cross-field rules, and what plugins declare
(``docs/plugins.md``, "What a factory may declare").

Every problem is appended to a list so the user sees all of them in one
:class:`~searchr1.core.errors.ConfigError`, each prefixed by file and line. A field's checks
come from its metadata (:mod:`searchr1.core.config_schema`): ``min``/``max``/``gt``/``lt``/
``choices`` (a list's: each item's), ``nonempty``/``unique``/``length``, ``inf_ok``;
``split`` lets a ``tuple[...]`` field take a comma or newline separated string."""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import re
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from searchr1.core.config_schema import SECTIONS, TRAIN_TABLES, Config
from searchr1.core.errors import ConfigError
from searchr1.core.logs import get_logger
from searchr1.core.old_imports import warn_plugins
from searchr1.core.plugins import ALSO_CHOSEN_BY, CHOSEN_BY_LIST, KINDS
from searchr1.core.secrets import REDACTED, redact_text

if TYPE_CHECKING:
    from searchr1.core.plugins import Registration, Registry

#: a plugin's settings dataclass (see :func:`plugin_settings`)
S = TypeVar("S")
Where = Callable[[str], str]


def check_table(
    table: Mapping[str, Any],
    cls: type,
    section: str,
    problems: list[str],
    where: Where,
) -> dict[str, Any]:
    """Check one table against a dataclass schema; append problems, return coerced values."""
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
        if error is None and (error := _check_range(coerced, f.metadata)):
            error = f"= {REDACTED if f.metadata.get('secret') else repr(value)} {error}"
        if error:
            problems.append(f"{where(dotted)}: {dotted} {error}")
        else:
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
    raise at once in one :class:`ConfigError`."""
    problems: list[str] = []
    table = config.plugin_table(section, name)
    values = check_table(table, cls, f"{section}.{name}", problems, lambda _: config.source)
    settings = cls(**values)
    if checks is not None:
        problems.extend(f"{config.source}: {problem}" for problem in checks(settings))
    if problems:
        raise ConfigError(problems)
    return settings


#: keys an older config may still write, and what to do instead
REMOVED = {
    "train.stages": "train runs the held-out eval and the cold start when their own settings "
    "ask ([train] eval_before_after/eval_every, [train.cold_start] steps); remove the key",
    "train.monitors": "train always runs the health checks ([train.health]); remove the key",
    "cold_start": "its settings are [train.cold_start]'s; rename the table",
}


def unknown_name(loc: str, dotted: str, key: str, known: list[str], what: str) -> str:
    # In a plugin's table ([model.NAME]) a key of its section ([model] api_base) is refused:
    # a shared key has one home, its section, where every provider reading it looks.
    section = dotted.partition(".")[0]
    shared = (
        [f.name for f in dataclasses.fields(SECTIONS[section])] if dotted.count(".") == 2 else []
    )
    hint = difflib.get_close_matches(key, [*known, *shared], n=1, cutoff=0.6)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(known)}"
    if dotted in REMOVED:
        suggestion = f" (no longer read: {REMOVED[dotted]})"
    elif hint and hint[0] in shared and hint[0] not in known:
        mean = "" if hint[0] == key else f"did you mean {hint[0]!r}? "
        suggestion = f"; {mean}{hint[0]} is a [{section}] setting: write it under [{section}]"
    return f"{loc}: unknown {what} {dotted!r}{suggestion}"


def _coerce(value: Any, hint: Any, meta: Mapping[str, Any]) -> tuple[Any, str | None]:
    """``value`` as the field's type ``hint`` wants it, or None and what is wrong."""
    if typing.get_origin(hint) is tuple:
        return _coerce_list(value, typing.get_args(hint)[0], meta)
    if typing.get_origin(hint) is dict:
        return _coerce_table(value, typing.get_args(hint)[1])
    return _coerce_scalar(value, hint, meta)


def _coerce_list(value: Any, item_type: type, meta: Mapping[str, Any]) -> tuple[Any, str | None]:
    """A list (or, metadata ``split``, a comma- or line-separated string) as a tuple."""
    if isinstance(value, str) and meta.get("split"):
        value = [v.strip() for v in re.split(r"[,\n]", value) if v.strip()]
    if not isinstance(value, list | tuple):  # a tuple: set through Config.replace
        return None, f"must be a list of {item_type.__name__}, got {type(value).__name__}"
    out = []
    for item in value:
        coerced, error = _coerce(item, item_type, {})
        if error:
            return None, f"items {error}"
        out.append(coerced)
    return tuple(out), None


def _coerce_table(value: Any, value_type: type) -> tuple[Any, str | None]:
    if not isinstance(value, dict):
        return None, f"must be a table, got {type(value).__name__} {value!r}"
    table = {}
    for key, item in value.items():
        coerced, error = _coerce(item, value_type, {})
        if error:
            return None, f"{key!r} {error}"
        table[key] = coerced
    return table, None


def _coerce_scalar(value: Any, hint: Any, meta: Mapping[str, Any]) -> tuple[Any, str | None]:
    """A bool, str, int (64-bit) or float (finite unless metadata ``inf_ok``); other types pass."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {bool: isinstance(value, bool), str: isinstance(value, str), float: number}.get(hint)
    if hint is int:
        ok = number and isinstance(value, int)
        if ok and not -(2**63) <= value < 2**63:
            # TOML integers are 64-bit; torch and numpy overflow on anything larger
            return None, f"must fit in 64 bits, got {value}"
    if hint is float and ok:
        value = float(value)
        if not math.isfinite(value) and not (math.isinf(value) and meta.get("inf_ok")):
            # nan passes every comparison (nan < 0 is False), so no range check would catch it
            return None, f"must be a finite number, got {value}"
    if ok is False:
        return None, f"must be {hint.__name__}, got {type(value).__name__} {value!r}"
    return value, None


def _check_range(value: Any, meta: Mapping[str, Any]) -> str | None:
    if meta.get("nonempty") and not value:
        return "must not be empty"
    if "length" in meta and len(value) != meta["length"]:
        return f"must have exactly {meta['length']} values"
    if meta.get("unique"):
        if any(not v.strip() for v in value):
            return "must not contain an empty name"
        repeated = sorted({v for v in value if value.count(v) > 1})
        if repeated:
            return f"lists {', '.join(map(repr, repeated))} more than once"
    # a list's choices and bounds hold for each of its items
    for item in value if isinstance(value, tuple) else [value]:
        lead = f"has {item!r}, which " if isinstance(value, tuple) else ""
        if "choices" in meta and item not in meta["choices"]:
            return f"{lead}is not one of {', '.join(map(repr, meta['choices']))}"
        for key, (op, ok) in _BOUNDS.items():
            if key in meta and not ok(item, meta[key]):
                return f"{lead}must be {op} {meta[key]}"
    return None


_BOUNDS = {
    "min": (">=", operator.ge),
    "max": ("<=", operator.le),
    "gt": (">", operator.gt),
    "lt": ("<", operator.lt),
}


def cross_checks(s: dict[str, Any], problems: list[str], where: Where) -> None:
    rollout, train, smoke = s["rollout"], s["train"], s["smoke"]
    if bool(smoke.question.strip()) != bool(smoke.answers):
        have, lack = "smoke.question", "smoke.answers"
        if smoke.answers:
            have, lack = lack, have
        problems.append(
            f"{where(have)}: {have} is set but {lack} is empty: [smoke] takes both, the question "
            f'and its golden answers (e.g. answers = ["..."]), or neither (the reference setup\'s)'
        )
    reward = s["reward"]
    unweighted = sorted(set(reward.weights) - {reward.name, *reward.terms})
    if unweighted:
        problems.append(
            f"{where('reward.weights')}: reward.weights names {', '.join(map(repr, unweighted))}, "
            f"which is neither reward.name ({reward.name!r}) nor in reward.terms: add it to "
            f"terms, or remove its weight"
        )
    scale = "group" if train.scale_advantages_by_std else train.scale_rewards
    if train.scale_advantages_by_std and train.scale_rewards == "batch":
        problems.append(
            f"{where('train.scale_advantages_by_std')}: train.scale_advantages_by_std = true "
            f'is scale_rewards = "group", but train.scale_rewards = "batch": keep one of them'
        )
    elif scale != "none" and train.advantage_estimator != "grpo":
        dotted = (
            "train.scale_rewards"
            if train.scale_rewards != "none"
            else ("train.scale_advantages_by_std")
        )
        problems.append(
            f"{where(dotted)}: {dotted} divides grpo's advantages by a reward std, but "
            f"train.advantage_estimator = {train.advantage_estimator!r} has its own scale; "
            f'set scale_rewards = "none", or advantage_estimator = "grpo"'
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


def heldout_refusals(config: Config) -> list[str]:
    """What ``train`` refuses in ``[train] eval_every``/``keep_best`` (each needs what it
    evaluates); ``config check`` says the same as warnings, since smoke and eval run anyway."""
    t, where = config.train, config.where
    out = []
    if t.eval_every and not config.data.eval:
        out.append(
            f"{where('train.eval_every')}: train.eval_every = {t.eval_every} needs a held-out QA "
            f'file: set [data] eval (e.g. "builtin:world/heldout.jsonl"), or set '
            f"train.eval_every = 0"
        )
    if t.keep_best and not t.eval_every:
        out.append(
            f"{where('train.keep_best')}: train.keep_best = true keeps the checkpoint with the "
            f"best periodic held-out EM: set train.eval_every (e.g. 5) and [data] eval, or set "
            f"train.keep_best = false"
        )
    return out


#: keys whose value is a URL: checked for an http(s) scheme and a host
_URL_KEY_RE = re.compile(r"^(?:api_base|base_url|url|.*_url)$")


def url_problem(dotted: str, value: Any) -> str | None:
    """A URL field without an http(s) scheme or host, which would otherwise fail at the
    first request as a vague, retried "connection error"."""
    from urllib.parse import urlsplit

    url = value.strip() if isinstance(value, str) else ""
    if not url or not _URL_KEY_RE.match(dotted.rsplit(".", 1)[-1]):
        return None
    parts = urlsplit(url)
    if "://" not in url:
        return f"has no scheme; write it as https://{url} (or http:// for a local server)"
    if parts.scheme.lower() not in ("http", "https"):
        rest = url.partition("://")[2]
        return f"has scheme {parts.scheme!r}; only http(s) works (did you mean https://{rest}?)"
    if not parts.hostname:
        return "has no host; write the whole address, e.g. https://example.com/api"
    return None


# --------------------------------------------------------------------------- what plugins declare


def _label(kind: str, section: str) -> str:
    return "provider" if section == "model" else kind.replace("_", " ")


#: the fields config check explains ("set in FILE:LINE", else why the value): an omitted
#: provider is inferred (:func:`infer_choices`), a chosen plugin's ``defaults`` say why
EXPLAINED = {
    "model.provider": "",
    "search.provider": "",
    "rollout.protocol": "the default: the model calls the search tool through its chat "
    "template and ends with one `Answer: ...` line (the reference setup's format)",
    "train.max_staleness": "0: synchronous steps (the model provider declares no other default)",
}


def infer_choices(
    raw: dict[str, dict[str, Any]], registry: Registry, where: Where, problems: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Fill in ``raw`` (a table per section) each omitted provider (the one whose
    ``infer_provider`` claims the table, else the ``default``) and the chosen plugins'
    ``factory.defaults``. Return ``dotted field -> why`` (:data:`EXPLAINED`, printed by
    config check) and ``dotted secret -> variable`` a literal should move to (the chosen
    plugins' ``secret_variables``)."""
    reasons: dict[str, str] = {}
    variables: dict[str, str] = {}
    for dotted, why in EXPLAINED.items():
        section, _, key = dotted.partition(".")
        written = key in raw.get(section, {})
        reasons[dotted] = f"set in {where(dotted)}" if written else f"not set; {why}"
    for kind, (_, field_name) in KINDS.items():
        if kind in CHOSEN_BY_LIST:
            continue
        section, _, key = field_name.partition(".")
        table = raw.setdefault(section, {})
        regs = registry.entries[kind].values()
        if key == "provider" and key not in table:
            table[key], why = _infer_provider(section, table, regs, where, problems)
            reasons[f"{section}.{key}"] = f"not set; {why}"
        name = table.get(key)
        reg = registry.entries[kind].get(name) if isinstance(name, str) else None
        if reg is None:
            continue
        for field_name, var in reg.secret_variables.items():
            variables[f"{section}.{field_name}"] = variables[f"{section}.{name}.{field_name}"] = var
        for dotted, (value, why) in reg.defaults.items():
            target, _, field_name = dotted.partition(".")
            if field_name not in raw.setdefault(target, {}):
                raw[target][field_name] = value
                label = _label(kind, section)
                reasons[dotted] = f"not set; {value} for {label} {reg.name!r}: {why}"
    return reasons, variables


def _infer_provider(
    section: str,
    table: dict[str, Any],
    regs: Collection[Registration],
    where: Where,
    problems: list[str],
) -> tuple[str, str]:
    """``(provider, why)`` for a ``[section]`` that names none: the one plugin whose
    ``infer_provider`` claims the table, else the one default; none or several is a problem
    (and ``("", "")``)."""
    claims = [
        (r.name, str(w))
        for r in regs
        if callable(r.infer_provider) and (w := r.infer_provider(dict(table)))
    ]
    found = claims or [
        (r.name, f"no installed plugin claims [{section}], so the default: {r.default}")
        for r in regs
        if r.default
    ]
    if len(found) != 1:
        names = " and ".join(repr(n) for n, _ in found) or "no installed plugin"
        how = "each claim it" if claims else "are each the default" if found else "claims it"
        problems.append(
            f"{where(section)}: [{section}] sets no provider and {names} {how}; write "
            f"provider = ... in [{section}] (the `plugins` command lists them)"
        )
    return found[0] if len(found) == 1 else ("", "")


def advice(config: Config, registry: Registry) -> list[str]:
    """Warnings before the run: section fields set that the chosen provider does not read
    although others do (``reads``), tables of chosen plugins that declare no settings, and
    each chosen ``factory.advise(config)``. A failing ``advise`` is said as one warning line
    naming the plugin (never silently dropped)."""
    out: list[str] = []
    for kind, chooser, name, reg in chosen_plugins(config, registry):
        if reg is None:
            continue  # plugin_problems names it
        section = chooser.partition(".")[0]
        for f in dataclasses.fields(getattr(config, section)):
            owners = sorted(r.name for r in registry.entries[kind].values() if f.name in r.reads)
            if owners and f.name not in reg.reads and f"{section}.{f.name}" in config.explicit:
                out.append(
                    f"{section}.{f.name} is ignored by {_label(kind, section)} {name!r} (a "
                    f"setting of {', '.join(map(repr, owners))}); remove it, or choose one of "
                    f"those as [{section}] provider"
                )
        table = config.plugin_table(section, name)
        if table and not reg.settings:
            out.append(
                f"{config.where(f'{section}.{name}')}: [{section}.{name}] sets "
                f"{', '.join(sorted(table))}, which {_label(kind, section)} {name!r} "
                f"(plugin {reg.plugin!r}) does not declare, so none of them is checked (a "
                f"typo would pass); the plugin declares its settings with register(..., "
                f'settings=...) (docs/plugins.md, "What a factory may declare")'
            )
        if not callable(reg.advise):
            continue
        try:
            out.extend(str(line) for line in reg.advise(config))
        except Exception as exc:  # noqa: BLE001 - a plugin's bug must not stop config check
            out.append(
                f"plugin {reg.plugin!r} ({reg.name!r}) could not advise on this config "
                f"({type(exc).__name__}: {exc}); its warnings are missing"
            )
    return out


# --------------------------------------------------------------------------- names and files


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


def plugin_problems(config: Config, registry: Registry) -> list[str]:
    """Every unregistered plugin name, unowned ``[section.name]`` table, and bad setting of
    a chosen plugin's declared tables (checked like the core's own sections; a field naming a
    plugin, metadata ``names=KIND``, against the registry), then, when those pass, what each
    chosen plugin's ``check`` says would stop it; secrets redacted."""
    problems: list[str] = []
    # the core's own sub-tables first, then each chosen plugin's declared ones
    declared: list[tuple[str, Mapping[str, type]]] = [("train", TRAIN_TABLES)]
    checks: dict[tuple[str, str], Callable[[Config], Iterable[str]]] = {}
    for kind, chooser, name, reg in chosen_plugins(config, registry):
        if reg is None:
            problems.append(
                f"{config.where(chooser)}: {registry.not_installed(kind, name, chooser)}"
            )
        else:
            declared.append((chooser.partition(".")[0], reg.settings))
            if callable(reg.check):
                checks[(kind, name)] = reg.check
    for section, settings in declared:
        _check_plugin_tables(config, registry, section, settings, problems)
    problems += _unowned_tables(config, registry)
    if not problems:  # a plugin's own check reads settings that passed theirs
        problems += _plugin_checks(config, checks)
    return [redact_text(p, config.secrets) for p in problems]


def _check_plugin_tables(
    config: Config,
    registry: Registry,
    section: str,
    settings: Mapping[str, type],
    problems: list[str],
) -> None:
    """Check each declared ``[section.table]`` like a core section, and each of its fields
    that names a plugin (metadata ``names=KIND``) against the registry."""
    where = config.where
    for table, cls in settings.items():
        prefix, own = f"{section}.{table}", config.plugin_table(section, table)
        values = check_table(own, cls, prefix, problems, where)
        for f in dataclasses.fields(cls):
            wanted, value = f.metadata.get("names"), values.get(f.name, f.default)
            if wanted and isinstance(value, str) and value not in registry.names(wanted):
                dotted = f"{prefix}.{f.name}"
                problems.append(f"{where(dotted)}: {registry.not_installed(wanted, value, dotted)}")


def _unowned_tables(config: Config, registry: Registry) -> list[str]:
    """A problem for each ``[section.name]`` table no installed plugin (nor the core: the
    loss's ``[train.loss]`` and :data:`TRAIN_TABLES`) owns: its settings would be ignored."""
    tables: dict[str, set[str]] = {"train": {"loss", *TRAIN_TABLES}}
    for kind, (_, field_name) in KINDS.items():
        tables.setdefault(field_name.partition(".")[0], set()).update(registry.names(kind))
    problems = []
    for dotted in config.plugins:
        section, _, name = dotted.partition(".")
        allowed = sorted(tables.get(section, set()))
        if name not in allowed:
            hint = difflib.get_close_matches(name, allowed, n=1)
            mean = f"did you mean [{section}.{hint[0]}]? " if hint else ""
            fix = (
                ", ".join(f"[{section}.{n}]" for n in allowed)
                or f"none (move its keys into [{section}])"
            )
            problems.append(
                f"{config.where(dotted)}: [{dotted}]: no installed plugin is called {name!r}, so "
                f"these settings would be ignored; {mean}tables allowed in [{section}]: {fix}"
            )
    return problems


def _plugin_checks(
    config: Config, checks: Mapping[tuple[str, str], Callable[[Config], Iterable[str]]]
) -> list[str]:
    """What each chosen plugin's ``check`` says; a check that raises is logged, not fatal (its
    factory meets the same problem when the run creates it)."""
    problems: list[str] = []
    for (kind, name), check in checks.items():
        try:
            problems.extend(str(p) for p in check(config))
        except Exception as exc:  # noqa: BLE001 - a plugin's bug must not stop every command
            get_logger().warning(
                "plugin_check_failed", kind=kind, name=name, error=f"{type(exc).__name__}: {exc}"
            )
    return problems


def chosen_plugins(
    config: Config, registry: Registry
) -> list[tuple[str, str, str, Registration | None]]:
    """``(kind, field, name, registration)`` of every plugin the config chooses by its field in
    :data:`~searchr1.core.plugins.KINDS` (one name or a list), then by the kind's
    :data:`~searchr1.core.plugins.ALSO_CHOSEN_BY` field; the registration is None when no
    plugin of that name is installed. An empty name is left to whoever infers or rejects it."""
    out = []
    for kind, (_, field_name) in KINDS.items():
        for chooser in filter(None, (field_name, ALSO_CHOSEN_BY.get(kind))):
            section, _, key = chooser.partition(".")
            chosen = getattr(getattr(config, section), key)
            for name in chosen if isinstance(chosen, tuple | list) else [chosen]:
                if isinstance(name, str) and name:
                    out.append((kind, chooser, name, registry.entries[kind].get(name)))
    return out


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
