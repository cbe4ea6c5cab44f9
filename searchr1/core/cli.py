"""The ``searchr1`` command line.

``searchr1 train|smoke|eval|report|plugins|config check|data check``. Each sub-command
loads the config (or the embedded offline default), loads the plugins, sets up logging and
hands over to the module that does the work. Errors a user can fix (config, plugins, data)
print as plain messages with exit code 2, never as tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from searchr1.core.config import ConfigError, load_config

# UserError also stays importable from here, where plugins written before
# searchr1.core.errors existed import it.
from searchr1.core.errors import UserError
from searchr1.core.plugins import KINDS, PluginError, load_registry

CONFIG_HELP = (
    "config.toml (default: $SEARCHR1_CONFIG when that file exists, else ./config.toml when it "
    "exists, else the embedded offline demo)"
)


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for a count flag: a whole number >= ``minimum``, else a usage
    error naming the flag (exit code 2) instead of a value that runs something unintended
    (``--max-steps -1`` used to run a whole evaluation)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a whole number >= {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--run-dir", help="folder for this run's logs and checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--max-steps", type=whole_number(0), help="override train.max_steps")


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = load_registry()
    for kind, (_, field_name) in KINDS.items():
        print(f"{kind} (chosen by {field_name}):")
        for name in registry.names(kind):
            reg = registry.entries[kind][name]
            print(f"  {name:<22} from plugin {reg.plugin}")
    print(f"plugins loaded: {', '.join(registry.plugins)}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    import tomli_w

    from searchr1.core.config_advice import unhonoured_settings
    from searchr1.core.config_resolve import resolve_config

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


def cmd_train(args: argparse.Namespace) -> int:
    from searchr1.core.train import main as train_main

    return train_main(args)


def cmd_smoke(args: argparse.Namespace) -> int:
    from searchr1.core.smoke import main as smoke_main

    return smoke_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="searchr1", description="Train LLM search agents with reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run the Search-R1 training loop")
    _add_run_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("smoke", help="one rollout group through the configured channels")
    _add_run_args(p)
    p.add_argument("--question", help="the question to ask")
    p.add_argument("--answer", action="append", help="a golden answer (repeatable)")
    p.add_argument("--group-size", type=whole_number(1), default=4)
    p.add_argument("--max-search-calls", type=whole_number(0), default=4)
    p.set_defaults(func=cmd_smoke)

    p = sub.add_parser("plugins", help="list installed plugins and what they register")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("config", help="config utilities")
    csub = p.add_subparsers(dest="config_command", required=True)
    c = csub.add_parser("check", help="validate and print the resolved config (redacted)")
    c.add_argument("--config", help=CONFIG_HELP)
    c.set_defaults(func=cmd_config_check)

    for extend in _EXTENSIONS:
        extend(sub)
    return parser


#: Functions that add more sub-commands (eval, report, data); each module appends itself.
_EXTENSIONS: list[Callable[[argparse._SubParsersAction], None]] = []


def _register_extensions() -> None:
    """Find the optional sub-command modules once per process (``main`` may run many times
    in one process, e.g. in tests)."""
    import importlib

    if _EXTENSIONS:
        return
    for module in ("searchr1.core.eval_cli", "searchr1.core.report_cli", "searchr1.core.data_cli"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        _EXTENSIONS.append(mod.add_parser)


def _config_from_env() -> str | None:
    """``$SEARCHR1_CONFIG`` when it names an existing file, else None (the embedded default).

    The container image sets it to ``/workspace/config.toml``, which exists only when the user
    has a config.toml in the project folder mounted there (compose.yaml): with one, every
    command uses it; without, they run the offline demo. ``--config`` always wins.
    """
    path = os.environ.get("SEARCHR1_CONFIG", "")
    return path if path and os.path.isfile(path) else None


def default_config_path() -> tuple[str | None, str]:
    """The config a command runs when ``--config`` is not given, and why: ``$SEARCHR1_CONFIG``
    when that file exists (the container image), else ``./config.toml`` when it exists (the
    seed's layout: config.toml and .env in the project folder), else the embedded demo.
    Also used by :mod:`searchr1.api`."""
    from_env = _config_from_env()
    if from_env is not None:
        return from_env, "$SEARCHR1_CONFIG names it and --config was not given"
    if os.path.isfile("config.toml"):
        return "config.toml", "./config.toml exists in the working directory; no --config given"
    return None, "no --config, no $SEARCHR1_CONFIG file and no ./config.toml: the offline demo"


def main(argv: Sequence[str] | None = None) -> int:
    _register_extensions()
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2) or --help (0), already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    if hasattr(args, "config"):
        if args.config is None:
            args.config, args.config_reason = default_config_path()
        else:
            args.config_reason = "--config"
        if args.func is not cmd_config_check:  # config check says it in its header line
            print(f"config: {args.config or '<embedded offline default>'} ({args.config_reason})")
    try:
        return int(args.func(args) or 0)
    except (ConfigError, PluginError, UserError) as exc:
        from searchr1.core.logs import redact_text

        text = redact_text(str(exc))  # a message may quote a value holding a key
        print(
            f"searchr1: error:\n{text}" if "\n" in text else f"searchr1: error: {text}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("searchr1: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
