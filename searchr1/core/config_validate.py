"""Checking a TOML table against a schema dataclass, and a plugin's own settings table.

:func:`searchr1.core.config.parse_config` calls :func:`check_table` once per section and
:func:`cross_checks` once the sections are valid; a plugin's factory calls
:func:`plugin_settings` (which calls :func:`check_table`) for its ``[section.name]`` table.
Every problem is appended to a list, so the user sees all of them in one
:class:`~searchr1.core.errors.ConfigError`, each prefixed by where it is (file and line).

The checks a field gets come from its metadata in :mod:`searchr1.core.config_schema`: types
from the annotation (a ``tuple[...]`` field takes a TOML list, or with ``split`` a comma or
newline separated string), ranges and choices from ``min``/``max``/``gt``/``lt``/``choices``,
list rules from ``nonempty``/``unique``/``length``/``unit_interval``; ``inf_ok`` lets a float
be ``inf``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from searchr1.core.config_schema import REDACTED, Config
from searchr1.core.errors import ConfigError

#: a plugin's settings dataclass (see :func:`plugin_settings`)
S = TypeVar("S")


def check_table(
    table: Mapping[str, Any],
    cls: type,
    section: str,
    problems: list[str],
    where: Any = None,
) -> dict[str, Any]:
    """Check one table against a dataclass schema; append problems (unknown keys with a
    "did you mean", wrong types, out-of-range values) and return the coerced values.
    Plugins call this for their own ``[section.name]`` table."""
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
    """The settings of a plugin's own ``[section.name]`` table as a ``cls`` instance.

    A plugin's factory calls this once per run. The table is checked with :func:`check_table`
    against the frozen dataclass ``cls`` (unknown keys with a "did you mean", types, and the
    ``min``/``max``/``choices``... checks in each field's ``metadata``; a bad value falls back
    to its default); ``checks`` may add problems that need the whole settings object or the
    rest of the config. Every problem is raised at once in one :class:`ConfigError`, each
    prefixed by the config file's name."""
    problems: list[str] = []
    table = config.plugin_table(section, name)
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
            f"name the question they answer (without both, smoke asks the seed's question)"
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
