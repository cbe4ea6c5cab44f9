"""Plugin loading and lookup by name.

The CLI calls :func:`load_registry` once at start-up. It loads every entry point of the
``searchr1`` group (the built-ins are registered there exactly like third-party packages),
checks that every hook implementation matches a spec, and collects what each plugin
registers. The core then asks the registry for one factory by the name given in config.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from searchr1.core import hookspecs

ENTRY_POINT_GROUP = "searchr1"

#: plugin kind -> (hook name, config field that chooses it)
KINDS: dict[str, tuple[str, str]] = {
    "model_provider": ("register_model_providers", "model.provider"),
    "search_provider": ("register_search_providers", "search.provider"),
    "reward": ("register_rewards", "reward.name"),
    "loss_fn": ("register_loss_fns", "train.loss_fn"),
    # the one kind chosen by a list: every name in [log] sinks
    "metric_sink": ("register_metric_sinks", "log.sinks"),
}


class PluginError(Exception):
    """A plugin failed to load, registered a clashing name, or was asked for by a name that
    no plugin registered."""


@dataclass(frozen=True)
class Registration:
    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str


@dataclass
class Registry:
    """Everything the loaded plugins registered, by kind and name."""

    entries: dict[str, dict[str, Registration]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )
    plugins: list[str] = field(default_factory=list)

    def add(self, kind: str, name: str, factory: Callable[..., Any], plugin: str) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {kind} with an empty name")
        if not callable(factory):
            raise PluginError(f"plugin {plugin!r} registered {kind} {name!r} with a non-callable")
        existing = self.entries[kind].get(name)
        if existing is not None and existing.plugin != plugin:
            raise PluginError(
                f"{kind} {name!r} is registered twice: by plugin {existing.plugin!r} and by "
                f"{plugin!r}; uninstall one of them"
            )
        self.entries[kind][name] = Registration(kind, name, factory, plugin)

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def get(self, kind: str, name: str) -> Registration:
        """The registration for ``name``, or a PluginError listing the names available."""
        try:
            return self.entries[kind][name]
        except KeyError:
            available = self.names(kind)
            field_name = KINDS[kind][1]
            hint = difflib.get_close_matches(name, available, n=1)
            did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
            raise PluginError(
                f"{field_name} = {name!r}: no {kind.replace('_', ' ')} of that name is "
                f"installed.{did_you_mean} Available: {', '.join(available) or '(none)'}."
            ) from None

    def create(self, kind: str, name: str, *args: Any) -> Any:
        """Call the factory registered as ``name``; errors name the plugin."""
        reg = self.get(kind, name)
        try:
            return reg.factory(*args)
        except PluginError:
            raise
        except Exception as exc:
            exc.add_note(f"(while creating {kind} {name!r} from plugin {reg.plugin!r})")
            raise


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            module = ep.load()
        except Exception as exc:
            dist = ep.dist.name if ep.dist else "?"
            raise PluginError(
                f"plugin {ep.name!r} (entry point {ep.value!r} of package {dist!r}) failed to "
                f"import: {type(exc).__name__}: {exc}"
            ) from exc
        pm.register(module, name=ep.name)


def load_registry(extra_plugins: Iterable[ModuleType | object] = ()) -> Registry:
    """Load installed plugins (plus ``extra_plugins``, used by tests) and collect what they
    register. Raises PluginError naming the plugin on an import error or a bad hook."""
    pm = _plugin_manager()
    _load_entry_points(pm)
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin {name!r} implements an unknown hook: {exc}") from exc

    registry = Registry(plugins=sorted(n for n, _ in pm.list_name_plugin()))
    for kind, (hook_name, _) in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():

            def register(
                name: str,
                factory: Callable[..., Any],
                _k: str = kind,
                _p: str = impl.plugin_name,
            ) -> None:
                registry.add(_k, name, factory, _p)

            try:
                impl.function(register)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} failed in {hook_name}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
    return registry
