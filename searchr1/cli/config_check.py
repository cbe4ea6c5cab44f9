"""``searchr1 config check``: validate a config and print it resolved, secrets redacted.

Every problem is reported in one run, in file order (one error, exit 2): the same check every
run makes before any plugin starts; what only ``train`` needs is a warning
(docs/commands.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from searchr1.cli.args import CONFIG_HELP

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config
    from searchr1.core.plugins import Registry


def cmd_config_check(args: argparse.Namespace) -> int:
    import tomli_w

    from searchr1.core import assets
    from searchr1.core.config import load_config
    from searchr1.core.config_validate import advice, heldout_refusals
    from searchr1.core.plugins import load_registry
    from searchr1.core.trainer_checks import loss_refusals

    registry = getattr(args, "registry", None) or load_registry()
    built_before = len(assets.built)
    # one ConfigError listing every problem, plugin names, tables and the chosen plugins'
    # own checks included, in file order: what every run refuses before any plugin starts
    config = load_config(args.config, registry=registry, check_plugins=True)
    refused = [*heldout_refusals(config), *loss_refusals(config, registry)]  # train's own
    data = [*data_problems(config), *(f"{p} ({STOPS})" for p in refused)]
    for warning in data:
        print(f"searchr1: warning: {warning}", file=sys.stderr)
    notes = [*config.warnings, *advice(config, registry)]
    stops = sum(STOPS in line or EVAL_STOPS in line for line in [*notes, *data])
    why = getattr(args, "config_reason", "")
    says = "1 warning says" if stops == 1 else f"{stops} warnings say"
    verdict = f"OK for smoke and eval; {says} {STOPS}" if stops else "OK"
    print(f"# {config.source}: {verdict} (secrets redacted)" + (f"; chosen: {why}" if why else ""))
    for dotted, reason in config.choices.items():
        section, key = dotted.split(".", 1)
        print(f"# {dotted} = {getattr(getattr(config, section), key)!r}: {reason}")
    for line in [*notes, *_token_fit(config, registry)]:
        print(f"# warning: {line}")
    for done in assets.built[built_before:]:  # the checks read the assets they name
        print(
            f"# built {done.what} in {done.seconds:.0f} s ({done.why}): {done.folder}; "
            f"later commands reuse it"
        )
    print(tomli_w.dumps(config.to_dict(redact=True)), end="")
    if getattr(args, "plugins", False):
        print(settings_text(config, registry), end="")
    return 0


def settings_text(config: Config, registry: Registry) -> str:
    """Every table of the plugins ``config`` chooses (and the core's ``[train.cold_start]``,
    ``[train.health]``) as TOML: each declared setting with its value for this config, a
    comment saying where the value comes from and its default; secrets redacted. A chosen
    plugin that declares no settings is named as such (its table, if any, is not checked)."""
    from searchr1.core.config_schema import ColdStartSettings, HealthSettings
    from searchr1.core.config_validate import chosen_plugins

    out = ["", "# the chosen plugins' settings: every key, its value here and its default"]
    out += _table_lines(config, "train", "cold_start", ColdStartSettings, "the cold start (core)")
    out += _table_lines(config, "train", "health", HealthSettings, "the health checks (core)")
    seen: set[tuple[str, str]] = set()
    for kind, chooser, name, reg in chosen_plugins(config, registry):
        if reg is None or (kind, name) in seen:
            continue
        seen.add((kind, name))
        origin = registry.origins.get(reg.plugin, "development")
        what = f"{kind.replace('_', ' ')} {name!r} (plugin {reg.plugin}, {origin})"
        if not reg.settings:
            out += ["", f"# {what}: declares no settings"]
        for table, cls in reg.settings.items():
            out += _table_lines(config, chooser.partition(".")[0], table, cls, what)
    return "\n".join(out) + "\n"


def _table_lines(config: Config, section: str, table: str, cls: type, what: str) -> list[str]:
    """``[section.table]`` and one ``key = value  # where it comes from`` line per field."""
    import dataclasses

    from searchr1.core.config_validate import plugin_settings
    from searchr1.core.secrets import REDACTED, redact_value

    values = plugin_settings(config, section, table, cls)
    written = config.plugin_table(section, table)
    out = ["", f"[{section}.{table}]  # {what}"]
    for f in dataclasses.fields(cls):
        value = getattr(values, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        secret = f.metadata.get("secret")
        shown = REDACTED if secret and value else redact_value(value, config.secrets)
        if shown is None:  # TOML has no null
            out.append(f"# {f.name} = (unset)")
            continue
        line = f"{f.name} = {_inline(shown)}"
        note = "default"
        if f.name in written:
            note = f"set in {config.where(f'{section}.{table}.{f.name}')}; default "
            note += REDACTED if secret and default else repr(default)
        helps = f"; {f.metadata['help']}" if f.metadata.get("help") else ""
        out.append(f"{line.rstrip()}  # {note}{helps}")
    return out


def _inline(value: object) -> str:
    """``value`` as a TOML value on one line (a table inline, ``{key = value, ...}``)."""
    import tomli_w

    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + "}"
    shown = list(value) if isinstance(value, tuple) else value
    return tomli_w.dumps({"v": shown}).partition("=")[2].strip()


#: the words of a warning about something ``searchr1 train`` refuses
STOPS = "train would stop here"
#: ... and ``searchr1 eval`` too (a missing ``data.eval``)
EVAL_STOPS = "train and eval would stop here"


def data_problems(config: Config) -> list[str]:
    """An empty ``data.train`` (train has nothing to learn from) and a ``data.train`` /
    ``data.eval`` naming a missing file: warnings, since a config is often checked before its
    data is downloaded, or meant for smoke or eval only."""
    from pathlib import Path

    from searchr1.core.assets import is_builtin, resolve

    where = config.where
    problems = []
    if not config.data.train:
        problems.append(
            f"{where('data')}: data.train is empty: {STOPS} (no training QA file); get "
            f"Search-R1's NQ + HotpotQA with `searchr1 data get nq-hotpotqa` and set [data] "
            f'train = "data/nq_hotpotqa/train.jsonl" (docs/reference-setup.md)'
        )
    for field_name in ("train", "eval"):
        path = getattr(config.data, field_name)
        if not path:
            continue
        stops = STOPS if field_name == "train" else EVAL_STOPS
        try:
            real = Path(resolve(path, config.assets)) if is_builtin(path) else Path(path)
        except FileNotFoundError as exc:
            problems.append(f"{where(f'data.{field_name}')}: data.{field_name}: {exc} ({stops})")
            continue
        if not real.is_file():
            problems.append(
                f"{where(f'data.{field_name}')}: data.{field_name} = {path!r}: file not found "
                f"({real.resolve()}; relative paths are read from the working directory): {stops}"
            )
    return problems


def _token_fit(config: Config, registry: Registry) -> list[str]:
    """:func:`~searchr1.core.token_limits.turn_fit_warnings` for the smoke question, when the
    tokenizer is local (no download: a check must not need the network); a note otherwise."""
    from searchr1.cli.smoke import smoke_question
    from searchr1.core.errors import ConfigValueError
    from searchr1.core.protocols import make_protocol
    from searchr1.core.token_limits import turn_fit_warnings
    from searchr1.kit.tokenizers import local_tokenizer

    tokenizer, why = local_tokenizer(config)
    if tokenizer is None:
        print(f"# token fit not checked: the tokenizer {why}")
        return []
    try:
        protocol = make_protocol(config, tokenizer, registry)
    except ConfigValueError as exc:  # e.g. tool_calls on a tokenizer without a chat template
        return [str(exc)]
    return turn_fit_warnings(config, protocol, smoke_question(argparse.Namespace(), config))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("config", help="config utilities")
    csub = p.add_subparsers(dest="config_command", required=True)
    c = csub.add_parser("check", help="validate and print the resolved config (redacted)")
    c.add_argument("--config", help=CONFIG_HELP)
    c.add_argument(
        "--plugins",
        action="store_true",
        help="also print every setting of the chosen plugins' tables, with its default",
    )
    # its header line says which config and why, instead of main's "config:" line
    c.set_defaults(func=cmd_config_check, announce_config=False)
