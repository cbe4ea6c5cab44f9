"""The plugin hooks of searchr1: one per plugin kind, and one for ``builtin:`` assets.

Each hook is called once, by :func:`searchr1.core.plugins.load_registry` at start-up, with a
``register(name, factory)`` callable. A plugin calls ``register`` once per thing it provides.
The core later picks **one** factory by the name given in config (``[model] provider``,
``[search] provider``, ``[reward] name``, ``[train] loss_fn``, ``[rollout] protocol``, each of
``[log] sinks``, each of ``[train] monitors``) and calls it with the run's :class:`~searchr1.core.config.Config`; an asset
is picked by the ``builtin:NAME/...`` path a config value names. Call order between plugins
never matters.

Documented with examples in ``docs/plugins.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from searchr1.core.agent_protocol import AgentProtocol
from searchr1.core.call_format import CallFormat
from searchr1.core.types import (
    Asset,
    FileFormat,
    LossFactory,
    MetricSinkFactory,
    ModelFactory,
    RewardFactory,
    SearchFactory,
    StepMonitorFactory,
)

PROJECT = "searchr1"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_model_providers(register: Callable[[str, ModelFactory], None]) -> None:
    """Register model providers: ``register("local", factory)``.

    ``factory(config)`` must return a :class:`~searchr1.core.types.Model`: its ``sampler``
    (a :class:`~searchr1.core.types.Sampler`) loaded and ready to sample, and its ``trainer``
    (a :class:`~searchr1.core.types.Trainer` with its declared
    :class:`~searchr1.core.types.TrainerCapabilities`; LoRA adapter attached, optimizer
    ready), or ``trainer=None`` for a provider that only samples (``smoke`` and ``eval`` run
    with it, ``train`` refuses it). One object may be both. Called once per run.

    Optional attributes of the factory (read by :mod:`searchr1.core.config_validate`; the
    same for search providers, see ``docs/plugins.md``, "What a factory may declare"):

    * ``factory.settings``: the frozen dataclass of ``[model.<name>]`` (or ``{table:
      dataclass}``); a field with ``also_in_section`` metadata may also be written in
      ``[model]`` itself, one with ``secret`` is masked everywhere.
    * ``factory.infer_provider(model_table) -> str | None``: a reason when a ``[model]`` table
      that names no provider means this one (two claims are a config error).
    * ``factory.default``: a reason string making this the provider when none is named or
      inferred (one per kind).
    * ``factory.defaults``: ``{"train.max_staleness": (value, why)}``, core fields it sets
      when the file leaves them out.
    * ``factory.secret_variables``: ``{"api_key": "VAR"}``, where a literal secret should move.
    * ``factory.advise(config) -> list[str]``: a cheap check before anything loads (no
      weights, no network); ``config check``, ``smoke`` and ``train`` print each line as a
      warning (e.g. settings the provider ignores, LoRA targets that leave whole layer types
      of the model out).
    """


@hookspec
def register_search_providers(register: Callable[[str, SearchFactory], None]) -> None:
    """Register search providers: ``register("my_search", factory)``.

    ``factory(config)`` must return a :class:`~searchr1.core.types.SearchProvider`. It reads
    ``config.search`` and its own settings (``plugin_settings(config, "search", name, cls)``).
    Called once per run, before the first rollout. The factory may carry the attributes listed
    under :func:`register_model_providers` (``settings``, ``infer_provider``, ``default``,
    ``defaults``, ``secret_variables``, ``advise``).
    """


@hookspec
def register_rewards(register: Callable[[str, RewardFactory], None]) -> None:
    """Register reward functions: ``register("my_reward", factory)``.

    ``factory(config)`` must return a :class:`~searchr1.core.types.RewardFn`, called once per
    finished trajectory with ``(trajectory, golden_answers)`` and returning a
    :class:`~searchr1.core.types.RewardResult` ``(reward, components)``.
    """


@hookspec
def register_loss_fns(register: Callable[[str, LossFactory], None]) -> None:
    """Register policy losses: ``register("my_loss", factory)``.

    ``factory(config)`` must return a :class:`~searchr1.core.types.LossFn` whose ``name`` is
    the registered name (remote providers send that name to their service) and whose call
    ``(logprobs_T, inputs)`` returns the loss **summed** over positions.
    """


@hookspec
def register_metric_sinks(register: Callable[[str, MetricSinkFactory], None]) -> None:
    """Register metric sinks: ``register("my_sink", factory)``.

    ``factory(config, run_dir)`` must return a :class:`~searchr1.core.types.MetricSink`. Every
    name listed in ``[log] sinks`` is created once per ``searchr1 train`` run, before the
    model loads; its settings live in ``config.plugin_table("log", name)``.
    """


@hookspec
def register_step_monitors(register: Callable[[str, StepMonitorFactory], None]) -> None:
    """Register step monitors: ``register("my_monitor", factory)``.

    ``factory(config)`` must return a :class:`~searchr1.core.types.StepMonitor`. Every name
    listed in ``[train] monitors`` is created once per ``searchr1 train`` run, before the
    model loads; its settings live in ``config.plugin_table("train", name)``. Its metrics
    join each step's ``metrics`` event, its alerts are logged as ``health_alert`` warnings,
    its state is saved in checkpoints under its name and its totals join ``train_done``.
    """


@hookspec
def register_agent_protocols(register: Callable[[str, type[AgentProtocol]], None]) -> None:
    """Register agent protocols: ``register("tags", TagsProtocol)``.

    The class (a :class:`~searchr1.core.agent_protocol.AgentProtocol` whose ``name`` is the
    registered name) says how a question becomes a prompt, how a turn becomes an action and
    how search results re-enter the token stream. ``[rollout] protocol`` picks one; the core
    builds it once per run as ``cls(tokenizer, enable_thinking=..., call_formats=...)``.
    """


@hookspec
def register_call_formats(register: Callable[[str, type[CallFormat]], None]) -> None:
    """Register tool-call formats: ``register("xml", XmlCallFormat)``.

    The class (a :class:`~searchr1.core.call_format.CallFormat` whose ``name`` is the
    registered name) renders and parses one model family's tool-call block. Never chosen in
    config: a protocol that calls tools through the chat template gets every registered
    format and uses the one the template itself writes (``detect_call_format``).
    """


@hookspec
def register_file_formats(register: Callable[[str, FileFormat], None]) -> None:
    """Register model file formats: ``register(".ext", FileFormat(version, convert))``.

    A config path that ends in the suffix resolves to a folder ``convert(file, folder)``
    wrote once into the cache (:func:`searchr1.core.builtins.resolve`), so every provider
    loads it like any Hugging Face checkpoint. Keep the hook cheap: import inside ``convert``.
    """


@hookspec
def register_assets(register: Callable[[str, Asset], None]) -> None:
    """Register ``builtin:`` assets: ``register("world", Asset(version, build))``.

    A config value ``builtin:NAME/FILE`` (a model folder, a corpus, a data file) resolves to
    ``FILE`` inside the folder that ``build(folder)`` of the asset registered as ``NAME``
    wrote; :func:`searchr1.core.builtins.resolve` builds it once per ``version`` into the
    cache (``$SEARCHR1_CACHE``) on first use. The hook itself must stay cheap: import heavy
    modules inside ``build``.
    """
