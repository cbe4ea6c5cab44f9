"""Plugin loading and lookup by name: every ``searchr1`` entry point (built-ins register
exactly like third-party packages) and every module ``$SEARCHR1_PLUGINS`` names (a plugin
under development, not packaged), each hook implementation checked against its spec."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from searchr1.core import hookspecs
from searchr1.core.errors import PluginError
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import Asset, TrainerCapabilities

ENTRY_POINT_GROUP = "searchr1"

#: Comma list of the third-party plugins (entry-point names) to load; unset loads every
#: installed one, empty loads none. Built-in plugins always load.
LOAD_PLUGINS_VAR = "SEARCHR1_LOAD_PLUGINS"

#: Comma list of importable module names (``PYTHONPATH=. SEARCHR1_PLUGINS=my_search``)
#: registered like entry points: a plugin loaded for development without packaging it.
MODULES_VAR = "SEARCHR1_PLUGINS"

#: where a loaded plugin came from, as ``searchr1 plugins`` shows it
BUILT_IN, THIRD_PARTY, DEVELOPMENT = "built-in", "third-party", "development"

#: plugin kind -> (hook name, config field that chooses it)
KINDS: dict[str, tuple[str, str]] = {
    "model_provider": ("register_model_providers", "model.provider"),
    "search_provider": ("register_search_providers", "search.provider"),
    "reward": ("register_rewards", "reward.name"),
    "loss_fn": ("register_loss_fns", "train.loss_fn"),
    # chosen by a list (CHOSEN_BY_LIST): every name in [log] sinks
    "metric_sink": ("register_metric_sinks", "log.sinks"),
    "agent_protocol": ("register_agent_protocols", "rollout.protocol"),
}

#: the kinds whose config field lists every name to create (not one name)
CHOSEN_BY_LIST = frozenset({"metric_sink"})

#: a second field that lists more plugins of a kind to create: the shaping terms added to the
#: chosen reward (:mod:`searchr1.core.rewards`)
ALSO_CHOSEN_BY: dict[str, str] = {"reward": "reward.terms"}


@dataclass(frozen=True)
class Registration:
    """One registered factory and what it declares (docs/plugins.md, "What a factory may
    declare"); a hook passes the declarations as keywords: ``register(name, factory, ...)``."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    #: ``{table: dataclass}``: the settings of each table ``[section.<table>]`` it reads (a
    #: hook may pass one dataclass: the table ``[section.<name>]``)
    settings: Mapping[str, type] = field(default_factory=dict)
    #: fields of its section it reads besides the loop (``[model] api_key``), their one home;
    #: set ones it does not read are named by ``advice``
    reads: tuple[str, ...] = ()
    #: non-empty: the choice when the config names none, and why (shown by ``config check``)
    default: str = ""
    #: ``{"section.field": (value, why)}`` applied when this factory is chosen
    defaults: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    #: ``infer_provider(table)``: why this factory is meant by a section naming none, or None
    infer_provider: Callable[[dict[str, Any]], str | None] | None = None
    #: ``{field: ENV_VARIABLE}`` a literal secret should move to
    secret_variables: Mapping[str, str] = field(default_factory=dict)
    #: ``advise(config)``: warning lines before the run
    advise: Callable[[Any], Iterable[str]] | None = None
    #: ``check(config)``: what stops the factory, found without building anything (no
    #: weights, index or connection), one ``file:line: problem`` each; ``config check``
    #: reports them as errors and every run refuses them before any plugin is created
    check: Callable[[Any], Iterable[str]] | None = None
    #: model providers: the :class:`~searchr1.core.types.TrainerCapabilities` its trainer
    #: will declare, when known before it is built (the losses a service computes, whether
    #: it scores a KL reference); ``train`` checks its losses against them before the model
    #: loads (:func:`~searchr1.core.trainer_checks.loss_refusals`)
    capabilities: TrainerCapabilities | None = None


@dataclass
class Registry:
    """Everything the loaded plugins registered, by kind and name."""

    entries: dict[str, dict[str, Registration]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )
    plugins: list[str] = field(default_factory=list)
    #: plugin name -> :data:`BUILT_IN`, :data:`THIRD_PARTY` or :data:`DEVELOPMENT`
    origins: dict[str, str] = field(default_factory=dict)
    #: installed third-party plugins that ``$SEARCHR1_LOAD_PLUGINS`` left unloaded
    skipped: list[str] = field(default_factory=list)
    #: ``builtin:NAME`` assets (hook ``register_assets``) and the plugin of each
    assets: dict[str, Asset] = field(default_factory=dict)
    asset_plugins: dict[str, str] = field(default_factory=dict)

    def add_asset(self, name: str, asset: Asset, plugin: str) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise PluginError(f"plugin {plugin!r} registered an asset named {name!r}")
        if not isinstance(asset, Asset):
            raise PluginError(
                f"plugin {plugin!r} registered asset {name!r} as {type(asset).__name__}; "
                "register a searchr1.core.types.Asset(version, build)"
            )
        existing = self.asset_plugins.get(name)
        if existing is not None and existing != plugin:
            raise PluginError(
                f"asset 'builtin:{name}' is registered twice: by plugin {existing!r} and by "
                f"{plugin!r}; uninstall one of them"
            )
        self.assets[name] = asset
        self.asset_plugins[name] = plugin

    def add(
        self, kind: str, name: str, factory: Callable[..., Any], plugin: str, **declared: Any
    ) -> None:
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
        settings = declared.pop("settings", None) or {}
        settings = dict(settings) if isinstance(settings, Mapping) else {name: settings}
        if not all(dataclasses.is_dataclass(cls) for cls in settings.values()):
            raise PluginError(
                f"plugin {plugin!r} declared settings of {kind} {name!r} that are "
                'not dataclasses (docs/plugins.md, "What a factory may declare")'
            )
        self.entries[kind][name] = Registration(kind, name, factory, plugin, settings, **declared)

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def get(self, kind: str, name: str) -> Registration:
        """The registration for ``name``, or a PluginError listing those available. An
        empty name (a config built in code) is the factory declared ``default``."""
        if not name:
            defaults = [r for r in self.entries[kind].values() if r.default]
            if len(defaults) == 1:
                return defaults[0]
        try:
            return self.entries[kind][name]
        except KeyError:
            raise PluginError(self.not_installed(kind, name, KINDS[kind][1])) from None

    def not_installed(self, kind: str, name: str, dotted: str) -> str:
        """``dotted = 'name': no <kind> of that name is installed``, the closest installed
        name and all of them."""
        names = self.names(kind)
        hint = difflib.get_close_matches(name, names, n=1)
        mean = f"did you mean {hint[0]!r}? " if hint else ""
        return (
            f"{dotted} = {name!r}: no {kind.replace('_', ' ')} of that name is installed; "
            f"{mean}installed: {', '.join(names) or '(none)'} (the `plugins` command lists them)"
        )

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


def _wanted_plugins() -> set[str] | None:
    """The names ``$SEARCHR1_LOAD_PLUGINS`` asks for; None when unset (load all)."""
    value = os.environ.get(LOAD_PLUGINS_VAR)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _is_builtin(ep: importlib.metadata.EntryPoint) -> bool:
    """Built-in: lives inside this package, whatever its entry-point name."""
    return ep.module.split(".")[0] == __name__.split(".")[0]


def _load_entry_points(pm: pluggy.PluginManager, origins: dict[str, str]) -> list[str]:
    """Register the entry points to load (each one's origin into ``origins``); returns those
    left out. A listed name nothing provides is a PluginError, so a typo never silently drops
    a plugin."""
    wanted = _wanted_plugins()
    # built-ins first: they load searchr1.sdk, whose names the old-import warnings point to
    eps = sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: not _is_builtin(ep)
    )
    if wanted is not None:
        missing = wanted - {ep.name for ep in eps}
        if missing:
            third_party = sorted({ep.name for ep in eps if not _is_builtin(ep)})
            raise PluginError(
                f"${LOAD_PLUGINS_VAR} names {', '.join(sorted(missing))}, which no installed "
                f"package provides as a {ENTRY_POINT_GROUP!r} entry point; installed "
                f"third-party plugins: {', '.join(third_party) or '(none)'}"
            )
    skipped: list[str] = []
    for ep in eps:
        if pm.get_plugin(ep.name) is not None:
            continue
        if wanted is not None and not _is_builtin(ep) and ep.name not in wanted:
            skipped.append(ep.name)
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
        origins[ep.name] = BUILT_IN if _is_builtin(ep) else THIRD_PARTY
    return sorted(set(skipped))


def _load_development_modules(pm: pluggy.PluginManager, origins: dict[str, str]) -> None:
    """Import and register each module ``$SEARCHR1_PLUGINS`` names, under its module name;
    one that fails to import is a PluginError naming it and the variable."""
    for name in (n.strip() for n in os.environ.get(MODULES_VAR, "").split(",")):
        if not name or pm.get_plugin(name) is not None:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            hint = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == name.split(".")[0]:
                hint = (
                    f"; is the folder holding it on PYTHONPATH (for example "
                    f"PYTHONPATH=. {MODULES_VAR}={name} searchr1 plugins)?"
                )
            raise PluginError(
                f"${MODULES_VAR} names module {name!r}, which failed to import: "
                f"{type(exc).__name__}: {exc}{hint}"
            ) from exc
        pm.register(module, name=name)
        origins[name] = DEVELOPMENT


def load_registry(extra_plugins: Iterable[ModuleType | object] = ()) -> Registry:
    """Load installed plugins, the modules ``$SEARCHR1_PLUGINS`` names and ``extra_plugins``
    (for tests); an import error or bad hook is a PluginError naming the plugin."""
    pm = _plugin_manager()
    origins: dict[str, str] = {}
    skipped = _load_entry_points(pm, origins)
    _load_development_modules(pm, origins)
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)
            origins[name] = DEVELOPMENT
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin {name!r} implements an unknown hook: {exc}") from exc

    registry = Registry(
        plugins=sorted(n for n, _ in pm.list_name_plugin()), origins=origins, skipped=skipped
    )
    for kind, (hook_name, _) in KINDS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():

            def register(
                name: str,
                factory: Callable[..., Any],
                _k: str = kind,
                _p: str = impl.plugin_name,
                **declared: Any,
            ) -> None:
                registry.add(_k, name, factory, _p, **declared)

            _call_hook(impl, hook_name, register)
    for impl in pm.hook.register_assets.get_hookimpls():

        def register_asset(name: str, asset: Asset, _p: str = impl.plugin_name) -> None:
            registry.add_asset(name, asset, _p)

        _call_hook(impl, "register_assets", register_asset)
    return registry


def _call_hook(impl: pluggy.HookImpl, hook_name: str, register: Callable[..., None]) -> None:
    """Call one plugin's hook; any failure becomes a PluginError naming plugin and hook."""
    try:
        impl.function(register)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin {impl.plugin_name!r} failed in {hook_name}: {type(exc).__name__}: {exc}"
        ) from exc


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
