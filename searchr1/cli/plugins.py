"""``searchr1 plugins``: every loaded plugin, what it registers, and what was left out."""

from __future__ import annotations

import argparse

from searchr1.core.plugins import KINDS, LOAD_PLUGINS_VAR, load_registry


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = load_registry()
    for kind, (_, field_name) in KINDS.items():
        chosen = f"chosen by {field_name}" if field_name else "the one the chat template writes"
        print(f"{kind} ({chosen}):")
        for name in registry.names(kind):
            reg = registry.entries[kind][name]
            print(f"  {name:<22} from plugin {reg.plugin}")
    print("assets (config paths builtin:NAME/...):")
    for name in sorted(registry.assets):
        print(f"  {name:<22} from plugin {registry.asset_plugins[name]}")
    print("file formats (a model path's suffix):")
    for suffix in sorted(registry.file_formats):
        print(f"  {suffix:<22} from plugin {registry.format_plugins[suffix]}")
    print("data formats (a [data] file's suffix):")
    for suffix in sorted(registry.data_formats):
        print(f"  {suffix:<22} from plugin {registry.data_format_plugins[suffix]}")
    print(f"plugins loaded: {', '.join(registry.plugins)}")
    if registry.skipped:
        print(f"installed but not in ${LOAD_PLUGINS_VAR}: {', '.join(registry.skipped)}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plugins", help="list installed plugins and what they register")
    p.set_defaults(func=cmd_plugins)
