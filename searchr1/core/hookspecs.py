"""The plugin hooks: one per plugin kind, plus ``builtin:`` assets and model and QA file formats.

:func:`searchr1.core.plugins.load_registry` calls each hook once at start-up with
``register(name, factory)``; the core later calls the one factory a config value names with
the run's :class:`~searchr1.core.config_schema.Config`. Order between plugins never matters.
Each hook is documented in full in ``docs/plugins.md``."""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.call_format import CallFormat
from searchr1.core.types import (
    Asset,
    DataFormat,
    FileFormat,
    LossFactory,
    MetricSinkFactory,
    ModelFactory,
    RewardFactory,
    SearchFactory,
)

PROJECT = "searchr1"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_model_providers(register: Callable[[str, ModelFactory], None]) -> None:
    """Register model providers: ``register("local", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.Model`, sampler ready and
    ``trainer`` set (LoRA attached, optimizer ready) or ``None`` for sample-only providers
    (``train`` refuses them). Called once per run. Optional factory attributes, read by
    :mod:`searchr1.core.config_validate`: ``factory.settings``, ``factory.infer_provider``,
    ``factory.default``, ``factory.defaults``, ``factory.secret_variables``,
    ``factory.advise`` (docs/plugins.md, "What a factory may declare").

    docs/plugins.md, ## register_model_providers"""


@hookspec
def register_search_providers(register: Callable[[str, SearchFactory], None]) -> None:
    """Register search providers: ``register("my_search", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.SearchProvider`; called once
    per run, before the first rollout. May carry the same attributes as a model factory.

    docs/plugins.md, ## register_search_providers"""


@hookspec
def register_rewards(register: Callable[[str, RewardFactory], None]) -> None:
    """Register reward functions: ``register("my_reward", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.RewardFn`, called once per
    finished trajectory. docs/plugins.md, ## register_rewards"""


@hookspec
def register_loss_fns(register: Callable[[str, LossFactory], None]) -> None:
    """Register policy losses: ``register("my_loss", factory)``.

    ``factory(config)`` returns a :class:`~searchr1.core.types.LossFn` named as registered;
    it returns the loss **summed** over positions. docs/plugins.md, ## register_loss_fns"""


@hookspec
def register_metric_sinks(register: Callable[[str, MetricSinkFactory], None]) -> None:
    """Register metric sinks: ``register("my_sink", factory)``.

    ``factory(config, run_dir)`` returns a :class:`~searchr1.core.types.MetricSink`; one per
    ``[log] sinks`` name per ``train`` run, before the model loads.
    docs/plugins.md, ## register_metric_sinks"""


@hookspec
def register_agent_protocols(register: Callable[[str, type[AgentProtocol]], None]) -> None:
    """Register agent protocols: ``register("tags", TagsProtocol)``.

    A :class:`~searchr1.core.agent_protocol.AgentProtocol` class, built once per run as
    ``cls(tokenizer, enable_thinking=..., call_formats=...)``.
    docs/plugins.md, ## register_agent_protocols"""


@hookspec
def register_call_formats(register: Callable[[str, type[CallFormat]], None]) -> None:
    """Register tool-call formats: ``register("xml", XmlCallFormat)``.

    A :class:`~searchr1.core.call_format.CallFormat` class; never chosen in config (a protocol
    gets every format and uses the one its chat template writes).
    docs/plugins.md, ## register_call_formats"""


@hookspec
def register_file_formats(register: Callable[[str, FileFormat], None]) -> None:
    """Register model file formats: ``register(".ext", FileFormat(version, convert))``.

    A path with the suffix resolves to the folder ``convert(file, folder)`` wrote once into
    the cache. Keep the hook cheap: import inside ``convert``.
    docs/plugins.md, ## register_file_formats"""


@hookspec
def register_data_formats(register: Callable[[str, DataFormat], None]) -> None:
    """Register QA file formats: ``register(".ext", DataFormat(read))``.

    :func:`searchr1.core.data.load_questions` reads a ``[data]`` file with the format of its
    suffix: ``read(file)`` yields ``(row_number, Question or reason)``; the core keeps the
    loop (skipped rows, unique ids, the empty-file error). A suffix no format claims is an
    error listing those that are registered. docs/plugins.md, ## register_data_formats"""


@hookspec
def register_assets(register: Callable[[str, Asset], None]) -> None:
    """Register ``builtin:`` assets: ``register("world", Asset(version, build))``.

    ``builtin:NAME/FILE`` resolves to ``FILE`` in the folder ``build(folder)`` wrote, built
    once per ``version`` into ``$SEARCHR1_CACHE``. Keep the hook cheap: import inside
    ``build``. docs/plugins.md, ## register_assets"""
