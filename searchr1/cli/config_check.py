"""``searchr1 config check``: validate a config and print it resolved, secrets redacted.

Plugin names and tables are checked against the installed plugins (one error listing them
all, exit 2); a data file that does not exist is a warning, since a config is often checked
before its data is downloaded.
"""

from __future__ import annotations

import argparse
import sys

from searchr1.cli.args import CONFIG_HELP


def cmd_config_check(args: argparse.Namespace) -> int:
    import tomli_w

    from searchr1.core.config import load_config
    from searchr1.core.config_advice import unhonoured_settings
    from searchr1.core.config_resolve import resolve_config
    from searchr1.core.plugins import load_registry

    config = load_config(args.config)
    for warning in resolve_config(config, load_registry()):
        print(f"searchr1: warning: {warning} (train and eval would stop here)", file=sys.stderr)
    why = getattr(args, "config_reason", "")
    print(f"# {config.source}: OK (secrets redacted)" + (f"; chosen: {why}" if why else ""))
    for dotted, reason in config.choices.items():
        section, key = dotted.split(".", 1)
        print(f"# {dotted} = {getattr(getattr(config, section), key)!r}: {reason}")
    for line in (*config.warnings, *unhonoured_settings(config)):
        print(f"# warning: {line}")
    print(tomli_w.dumps(config.to_dict(redact=True)), end="")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("config", help="config utilities")
    csub = p.add_subparsers(dest="config_command", required=True)
    c = csub.add_parser("check", help="validate and print the resolved config (redacted)")
    c.add_argument("--config", help=CONFIG_HELP)
    # its header line says which config and why, instead of main's "config:" line
    c.set_defaults(func=cmd_config_check, announce_config=False)
