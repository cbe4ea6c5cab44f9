"""``searchr1 config check``: validate a config and print it resolved, secrets redacted.

Plugin names and tables are checked against the installed plugins (one error listing them
all, exit 2); a data file that does not exist is a warning, since a config is often checked
before its data is downloaded. When the tokenizer is on this machine, the smoke question's
first prompt and one well-formed search turn are rendered and checked against
``max_trajectory_tokens`` and ``max_new_tokens`` (:mod:`searchr1.core.token_limits`).
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

    from searchr1.core.config import load_config
    from searchr1.core.config_validate import advice, check_plugin_choices
    from searchr1.core.plugins import load_registry

    registry = load_registry()
    config = load_config(args.config, registry=registry)
    check_plugin_choices(config, registry)  # one ConfigError listing every bad name or table
    for warning in data_problems(config):
        print(f"searchr1: warning: {warning} (train and eval would stop here)", file=sys.stderr)
    why = getattr(args, "config_reason", "")
    print(f"# {config.source}: OK (secrets redacted)" + (f"; chosen: {why}" if why else ""))
    for dotted, reason in config.choices.items():
        section, key = dotted.split(".", 1)
        print(f"# {dotted} = {getattr(getattr(config, section), key)!r}: {reason}")
    for line in [*config.warnings, *advice(config, registry), *_token_fit(config, registry)]:
        print(f"# warning: {line}")
    print(tomli_w.dumps(config.to_dict(redact=True)), end="")
    return 0


def data_problems(config: Config) -> list[str]:
    """A ``data.train`` / ``data.eval`` naming a missing file (empty is fine): warnings, since
    a config is often checked before its data is downloaded."""
    from pathlib import Path

    from searchr1.core.assets import is_builtin, resolve

    where = config.where
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
    # its header line says which config and why, instead of main's "config:" line
    c.set_defaults(func=cmd_config_check, announce_config=False)
