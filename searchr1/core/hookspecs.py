"""The plugin hooks: one per plugin kind, plus ``builtin:`` assets.

:func:`searchr1.core.plugins.load_registry` calls each hook once at start-up with
``register(name, factory, **declared)`` (what a factory may declare:
:class:`~searchr1.core.plugins.Registration`); the core later calls the one factory a config
value names with the run's :class:`~searchr1.core.config_schema.Config`. Order between
plugins never matters. Each hook is documented in full in ``docs/plugins.md``."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import pluggy

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import (
    Asset,
    LossFactory,
    MetricSinkFactory,
    ModelFactory,
    RewardFactory,
    SearchFactory,
)

PROJECT = "searchr1"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

F = TypeVar("F", contravariant=True)


class Register(Protocol[F]):
    """The ``register`` each hook is called with: ``register(name, factory, **declared)``.
    The declarations are the fields of :class:`~searchr1.core.plugins.Registration` after
    ``plugin`` (``settings=``, ``reads=``, ``default=``, ...; docs/plugins.md, "What a factory
    may declare"), checked when the hook runs: an unknown one is a PluginError naming the
    plugin."""

    def __call__(self, name: str, factory: F, /, **declared: Any) -> None: ...


@hookspec
def register_model_providers(register: Register[ModelFactory]) -> None:
    """Register model providers: ``register("local", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.Model`, sampler ready and
    ``trainer`` set (LoRA attached, optimizer ready) or ``None`` for sample-only providers
    (``train`` refuses them). Called once per run. Optional keywords, read by
    :mod:`searchr1.core.config_validate`: ``settings``, ``reads``, ``infer_provider``,
    ``default``, ``defaults``, ``secret_variables``, ``advise``, ``check``, ``capabilities``
    (docs/plugins.md, "What a factory may declare").

    docs/plugins.md, ## register_model_providers"""


@hookspec
def register_search_providers(register: Register[SearchFactory]) -> None:
    """Register search providers: ``register("my_search", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.SearchProvider`; called once
    per run, before the first rollout. May declare the same keywords as a model factory.

    docs/plugins.md, ## register_search_providers"""


@hookspec
def register_rewards(register: Register[RewardFactory]) -> None:
    """Register reward functions: ``register("my_reward", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.RewardFn`, called once per
    finished trajectory. docs/plugins.md, ## register_rewards"""


@hookspec
def register_loss_fns(register: Register[LossFactory]) -> None:
    """Register policy losses: ``register("my_loss", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.LossFn` named as registered;
    it returns the loss **summed** over positions. docs/plugins.md, ## register_loss_fns"""


@hookspec
def register_metric_sinks(register: Register[MetricSinkFactory]) -> None:
    """Register metric sinks: ``register("my_sink", factory)``.

    ``factory(config, run_dir)`` returns a :class:`~searchr1.core.types.MetricSink`; one per
    ``[log] sinks`` name per ``train`` run, before the model loads.
    docs/plugins.md, ## register_metric_sinks"""


@hookspec
def register_agent_protocols(register: Register[type[AgentProtocol]]) -> None:
    """Register agent protocols: ``register("tags", TagsProtocol)``.

    A :class:`~searchr1.core.agent_protocol.AgentProtocol` class, built once per run as
    ``cls(tokenizer, enable_thinking=...)``.
    docs/plugins.md, ## register_agent_protocols"""


@hookspec
def register_assets(register: Register[Asset]) -> None:
    """Register ``builtin:`` assets: ``register("world", Asset(version, build))``.

    ``builtin:NAME/FILE`` resolves to ``FILE`` in the folder ``build(folder)`` wrote, built
    once per ``version`` into ``$SEARCHR1_CACHE``. Keep the hook cheap: import inside
    ``build``. docs/plugins.md, ## register_assets"""


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
