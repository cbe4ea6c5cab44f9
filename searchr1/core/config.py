"""config.toml: schema, ``${VAR}`` interpolation, validation and redaction.

The CLI calls :func:`load_config` once per command. It loads ``.env`` (next to the config file
and in the working directory; variables already set win), fills ``${VAR}`` placeholders,
checks every field against the schema below and raises :class:`ConfigError` listing **all**
problems at once, each with the file and line where it can be found. With no file it loads
the embedded offline default (``searchr1/defaults/offline.toml``).

Sections are frozen dataclasses; each field's metadata carries its checks (``min``, ``max``,
``gt``, ``choices``) and whether it is a ``secret``. A plugin keeps its own settings in a
sub-table such as ``[search.zhihu]`` and checks them with :func:`check_table`.
Relative paths are resolved against the working directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import tomli

from searchr1.core.config_advice import infer_choices, literal_secret_warnings
from searchr1.core.config_values import mask_secrets, secret_variable_values, url_problems
from searchr1.core.errors import ConfigError

DEFAULT_CONFIG_NAME = "offline.toml"
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: a variable name that holds a secret: a KEY(S)/TOKEN/PASSWORD part (``HF_TOKEN``,
#: ``ZHIHU_SEARCH_KEYS``, ``APIKEY``) or SECRET/PASSWORD anywhere; ``MAX_TOKENS`` is not one,
#: which is why name parts are matched rather than substrings (a masked "2048" would blank
#: every number 2048 in the logs)
_SECRET_VAR_RE = re.compile(
    r"(?:^|_)(?:API_?)?(?:KEYS?|TOKEN|PASS|PASSWD)(?:_|$)|SECRET|PASSWORD", re.IGNORECASE
)
REDACTED = "***"
#: a plugin's settings dataclass (see :func:`plugin_settings`)
S = TypeVar("S")


def _f(default: Any, **checks: Any) -> Any:
    """A schema field: ``default`` plus checks kept in the field's metadata."""
    # Secrets stay out of repr(), so a config printed in a traceback or log leaks nothing.
    show = not checks.get("secret", False)
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=checks, repr=show)
    return field(default=default, metadata=checks, repr=show)


@dataclass(frozen=True)
class RunConfig:
    name: str = _f("", help="run name; empty = a timestamp")
    dir: str = _f("runs", help="parent folder of run folders")
    seed: int = _f(0, min=0)


@dataclass(frozen=True)
class ModelConfig:
    provider: str = _f(
        "local",
        help="model provider plugin name; when absent from the file: taotoken if [model] sets "
        "api_base or api_key, else local (config_advice.infer_choices)",
    )
    api_base: str = _f("")
    api_key: str = _f("", secret=True)
    base_model: str = _f("builtin:tiny")
    temperature: float = _f(0.8, gt=0.0)
    top_p: float = _f(0.95, gt=0.0, max=1.0)
    max_new_tokens: int = _f(2048, min=1)
    device: str = _f("auto", help="auto | cpu | cuda | cuda:N | mps")
    dtype: str = _f("auto", choices=("auto", "float32", "bfloat16", "float16"))


@dataclass(frozen=True)
class LoraConfig:
    rank: int = _f(32, min=1, max=1024)
    alpha: float = _f(64.0, gt=0.0)
    dropout: float = _f(0.05, min=0.0, lt=1.0)
    target_modules: tuple[str, ...] = _f(
        ("q_proj", "k_proj", "v_proj", "o_proj"), nonempty=True, split=True
    )  # or "all-linear" (peft: every linear layer but the output head)


@dataclass(frozen=True)
class RolloutConfig:
    questions_per_batch: int = _f(8, min=1)
    group_size: int = _f(8, min=2)
    max_search_calls: int = _f(4, min=0)
    max_assistant_turns: int = _f(6, min=1)
    max_trajectory_tokens: int = _f(8192, min=16)
    protocol: str = _f("tool_calls", choices=("tags", "tool_calls"))
    enable_thinking: bool = _f(False, help="passed to the chat template (tool_calls protocol)")
    max_observation_tokens: int = _f(512, min=8)
    dynamic_sampling: bool = _f(False)
    max_extra_draws: int = _f(16, min=0)


@dataclass(frozen=True)
class SearchConfig:
    provider: str = _f("local")
    api_keys: tuple[str, ...] = _f((), secret=True, split=True)
    api_base: str = _f("")
    top_k: int = _f(3, min=1, max=100)
    timeout_seconds: float = _f(10.0, gt=0.0)
    max_retries: int = _f(2, min=0)
    max_concurrency: int = _f(16, min=1)
    key_cooldown_seconds: float = _f(
        math.inf, gt=0.0, inf_ok=True, help="inf = benched for the whole run"
    )
    cache: bool = _f(True)
    max_query_chars: int = _f(512, min=1)
    min_success_rate: float = _f(0.9, min=0.0, max=1.0)


@dataclass(frozen=True)
class RewardConfig:
    name: str = _f("format_answer")


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = _f(20, min=0)
    save_every: int = _f(5, min=1)
    max_staleness: int = _f(0, min=0, help="0 = synchronous steps; k = rollouts k steps ahead")
    loss_fn: str = _f("importance_sampling")
    max_datum_tokens: int = _f(8192, min=16)
    max_micro_batch_datums: int = _f(32, min=1)
    max_micro_batch_tokens: int = _f(64000, min=16)
    scale_advantages_by_std: bool = _f(False)
    guard_max_waits: int = _f(3, min=0)
    guard_backoff_seconds: float = _f(30.0, min=0.0)
    dump_trajectories: int = _f(4, min=0)
    eval_before_after: bool = _f(False)


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = _f(1e-5, gt=0.0)
    betas: tuple[float, ...] = _f((0.9, 0.95), length=2, unit_interval=True)
    weight_decay: float = _f(0.01, min=0.0)
    eps: float = _f(1e-8, gt=0.0)
    grad_clip: float = _f(1.0, min=0.0, help="0 = no clipping")


@dataclass(frozen=True)
class DataConfig:
    train: str = _f("", help="QA file for training (JSONL or parquet)")
    eval: str = _f("", help="held-out QA file")


@dataclass(frozen=True)
class LogConfig:
    sinks: tuple[str, ...] = _f(
        (),
        split=True,
        unique=True,
        help="metric sinks besides events.jsonl (always on): tensorboard, ...",
    )


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "model": ModelConfig,
    "lora": LoraConfig,
    "rollout": RolloutConfig,
    "search": SearchConfig,
    "reward": RewardConfig,
    "train": TrainConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "log": LogConfig,
}


@dataclass(frozen=True)
class Config:
    """The validated config of one run."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    log: LogConfig = field(default_factory=LogConfig)
    #: plugin sub-tables, keyed "section.name" (e.g. "search.zhihu")
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "<defaults>"
    #: every secret value (for log redaction); never printed
    secrets: frozenset[str] = field(default_factory=frozenset, repr=False)
    #: dotted field -> the ``${VAR}`` it was filled from (so errors can name the variable)
    variables: Mapping[str, str] = field(default_factory=dict)
    #: dotted field -> why it has its value, for fields chosen by inference (config check)
    choices: Mapping[str, str] = field(default_factory=dict)
    #: problems that do not stop a run (literal secrets, empty exported variables), printed
    #: by config check, smoke and train
    warnings: tuple[str, ...] = ()
    #: the dotted fields the file sets (so a warning can tell "set" from "defaulted")
    explicit: frozenset[str] = field(default_factory=frozenset)

    def plugin_table(self, section: str, name: str) -> dict[str, Any]:
        """The raw sub-table ``[section.name]`` (empty when absent)."""
        return dict(self.plugins.get(f"{section}.{name}", {}))

    def replace(self, **sections: Any) -> Config:
        """A copy with some fields changed: ``cfg.replace(train={"max_steps": 2})``."""
        changes: dict[str, Any] = {}
        for name, value in sections.items():
            if isinstance(value, Mapping):
                changes[name] = dataclasses.replace(getattr(self, name), **value)
            else:
                changes[name] = value
        return dataclasses.replace(self, **changes)

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved config as plain TOML-able data; secrets replaced by ``***``."""
        out: dict[str, Any] = {}
        for section in SECTIONS:
            obj = getattr(self, section)
            table: dict[str, Any] = {}
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if redact and f.metadata.get("secret") and value:
                    value = [REDACTED] * len(value) if isinstance(value, tuple) else REDACTED
                elif redact:
                    value = _redact_values(value, self.secrets)
                table[f.name] = list(value) if isinstance(value, tuple) else value
            out[section] = table
        for key, table in self.plugins.items():
            section, name = key.split(".", 1)
            out[section][name] = _redact_values(dict(table), self.secrets) if redact else table
        return out


def _redact_values(value: Any, secrets: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _redact_values(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact_values(v, secrets) for v in value)
    if isinstance(value, str):
        return mask_secrets(value, secrets)
    return value


# --------------------------------------------------------------------------- loading


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
        notes = _load_dotenv(base)
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


def _load_dotenv(config_dir: Path) -> list[str]:
    """Load ``.env`` files into ``os.environ`` (a variable set in the environment wins) and
    return warnings. A variable exported but **empty** does not win: it is filled from ``.env``
    when a file gives it a value, and the warning says so (an empty export is almost always a
    leftover ``export VAR=``, and silently shadowing the file's key is what users trip on)."""
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
    secrets.update(secret_variable_values(raw, "", env, _SECRET_FIELDS))
    raw = _interpolate(raw, "", env, problems, where, secrets, variables)
    explicit = frozenset(
        f"{s}.{k}" for s, t in raw.items() if isinstance(t, dict) for k in t if s in SECTIONS
    )
    choices = infer_choices(raw, where)

    sections: dict[str, Any] = {}
    plugins: dict[str, dict[str, Any]] = {}
    for key in raw:
        if key not in SECTIONS:
            problems.append(_unknown(where(key), key, key, list(SECTIONS), "section"))
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
        _cross_checks(sections, problems, where)
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
            problems.append(_unknown(where(dotted), dotted, key, list(fields), "key"))
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


def _unknown(loc: str, dotted: str, key: str, known: list[str], what: str) -> str:
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


def _cross_checks(s: dict[str, Any], problems: list[str], where: Any) -> None:
    rollout, train = s["rollout"], s["train"]
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


#: config fields whose value is a secret (their metadata says ``secret``)
_SECRET_FIELDS = frozenset(
    f"{section}.{f.name}"
    for section, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
    if f.metadata.get("secret")
)


def _interpolate(
    value: Any,
    dotted: str,
    env: Mapping[str, str],
    problems: list[str],
    where: Any,
    secrets: set[str],
    variables: dict[str, str],
) -> Any:
    """``value`` with every ``${VAR}`` filled from ``env``; records secrets and, in
    ``variables``, which variable filled each dotted field."""
    if isinstance(value, dict):
        return {
            k: _interpolate(
                v, f"{dotted}.{k}" if dotted else k, env, problems, where, secrets, variables
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, dotted, env, problems, where, secrets, variables) for v in value]
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
            secrets.add(got)
            secrets.update(p.strip() for p in re.split(r"[,\n]", got) if p.strip())
        return got

    return _VAR_RE.sub(fill, value)


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
