"""``searchr1 plugins``: every loaded plugin, where it came from (built-in, an installed
third-party package, or a module ``$SEARCHR1_PLUGINS`` names for development), what it
registers, and what was left out."""

from __future__ import annotations

import argparse

from searchr1.core.plugins import KINDS, LOAD_PLUGINS_VAR, MODULES_VAR, load_registry


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = getattr(args, "registry", None) or load_registry()

    def origin(plugin: str) -> str:
        where = registry.origins.get(plugin, "development")
        return f"{where}, ${MODULES_VAR}" if where == "development" else where

    for kind, (_, field_name) in KINDS.items():
        print(f"{kind} (chosen by {field_name}):")
        for name in registry.names(kind):
            reg = registry.entries[kind][name]
            print(f"  {name:<22} from plugin {reg.plugin} ({origin(reg.plugin)})")
    print("assets (config paths builtin:NAME/...):")
    for name in sorted(registry.assets):
        plugin = registry.asset_plugins[name]
        print(f"  {name:<22} from plugin {plugin} ({origin(plugin)})")
    print(f"plugins loaded: {', '.join(f'{p} ({origin(p)})' for p in registry.plugins)}")
    if registry.skipped:
        print(f"installed but not in ${LOAD_PLUGINS_VAR}: {', '.join(registry.skipped)}")
    print(
        "the settings of the plugins a config chooses, with defaults: searchr1 config check --plugins"
    )
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plugins", help="list installed plugins and what they register")
    p.set_defaults(func=cmd_plugins)
