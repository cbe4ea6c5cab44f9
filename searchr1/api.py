"""searchr1's Python API: the reference setup's smoke script, importable.

The reference setup's minimal validation script (section 4) imports ``run_rollout_group`` and
``ZhihuSearchClient`` from modules of its own; with searchr1 only its import lines change::

    from searchr1.api import run_rollout_group
    from searchr1.api import ZhihuSearchClient
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.config import load_config, load_dotenv_files
from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import Registry
from searchr1.core.types import Question, SearchProvider, SearchResponse, Trajectory

if TYPE_CHECKING:
    from searchr1.core.evaluation import EvalResult

__all__ = [
    "RolloutGroup",
    "TrajectoryResult",
    "ZhihuSearchClient",
    "load_api_config",
    "run_rollout_group",
]


def load_api_config(config: Config | str | os.PathLike[str] | None, registry: Registry) -> Config:
    """The config the API runs with ``registry``'s plugins: ``config`` itself (its
    ``builtin:`` paths resolved against ``registry``'s assets), the file it names, or the
    CLI's default (``$SEARCHR1_CONFIG``, ``./config.toml``, the embedded offline demo)."""
    from searchr1.defaults import default_config_path

    if isinstance(config, Config):  # made in Python (``Config().replace(...)``) or loaded
        return dataclasses.replace(config, assets=registry.assets)
    path = config if config is not None else default_config_path()[0]
    loaded = load_config(path, registry=registry)
    _quiet_logging(loaded)
    return loaded


def _quiet_logging(config: Config) -> None:
    """Send log events to stderr (redacted) unless the caller configured structlog: the
    reference setup's script prints its own lines on stdout."""
    import structlog

    from searchr1.core.logs import get_logger, setup_logging
    from searchr1.core.secrets import register_secrets

    register_secrets(config.secrets)
    if not structlog.is_configured():
        setup_logging("api", None, secrets=config.secrets, stream=sys.stderr)
    for line in config.warnings:
        get_logger().warning("config_warning", detail=line)


class ZhihuSearchClient:
    """The Zhihu search channel with the reference setup's constructor: ``ZhihuSearchClient(keys=...,
    top_k=3)``. Keys rotate round-robin; a key answering 429 is benched and the others carry
    on. ``success_rate`` / ``error_rate`` cover every search made so far.

    ``api_base`` and any other ``[search]`` setting (``timeout_seconds=``, ``max_retries=``,
    ...) may be passed; the rest come from the config's ``[search]`` table when it names
    ``zhihu`` (see the module docstring), else from the defaults."""

    def __init__(
        self,
        keys: Sequence[str] = (),
        top_k: int = 3,
        *,
        api_base: str | None = None,
        config: Config | str | os.PathLike[str] | None = None,
        **search_settings: Any,
    ):
        from searchr1.core.config_schema import SearchConfig
        from searchr1.core.plugins import load_registry

        registry = load_registry()
        cfg = load_api_config(config, registry)
        if cfg.search.provider != "zhihu":
            cfg = dataclasses.replace(cfg, search=SearchConfig(provider="zhihu"))
        if top_k < 1:
            raise ConfigError([f"ZhihuSearchClient: top_k must be >= 1, got {top_k}"])
        own = {f.name for f in dataclasses.fields(SearchConfig)}
        changes: dict[str, Any] = {k: v for k, v in search_settings.items() if k in own}
        changes.update(api_keys=tuple(k.strip() for k in keys if k.strip()), top_k=top_k)
        # The rest is the provider's ([search.zhihu]): its settings check names any unknown key.
        table = cfg.plugin_table("search", "zhihu")
        table.update((k, v) for k, v in search_settings.items() if k not in own)
        if api_base:
            changes["api_base"] = api_base
        cfg = dataclasses.replace(cfg, plugins={**cfg.plugins, "search.zhihu": table})
        self.config = cfg.replace(search=changes)
        self.top_k = top_k
        self.provider: SearchProvider = registry.create("search_provider", "zhihu", self.config)

    async def search(self, query: str, top_k: int | None = None) -> SearchResponse:
        """One search (a failure comes back as ``SearchResponse.error``, never raised)."""
        return await self.provider.search(query, top_k or self.top_k)

    def metrics(self) -> dict[str, float]:
        """``calls``, ``success_rate``, ``error_rate``, ``latency_*``, ``http_429``, ..."""
        return dict(self.provider.metrics())

    @property
    def success_rate(self) -> float:
        """Share of searches that returned results (1.0 before the first search)."""
        return float(self.metrics().get("success_rate", 1.0))

    @property
    def error_rate(self) -> float:
        """Share of searches that failed (0.0 before the first search)."""
        return float(self.metrics().get("error_rate", 0.0))

    async def aclose(self) -> None:
        await self.provider.aclose()


@dataclass(frozen=True)
class TrajectoryResult:
    """One trajectory of a group, as the reference setup's script prints it."""

    reward: float
    search_calls: int
    final_answer: str | None
    #: the reward's components (``format``, ``correct``, ...)
    components: Mapping[str, float]
    #: the full record: tokens, turns, observations, log-probs, end reason
    trajectory: Trajectory


@dataclass(frozen=True)
class RolloutGroup:
    """What :func:`run_rollout_group` returns."""

    question: str
    golden_answers: tuple[str, ...]
    trajectories: tuple[TrajectoryResult, ...]


async def run_rollout_group(
    question: str,
    group_size: int = 8,
    max_search_calls: int | None = None,
    search_client: ZhihuSearchClient | SearchProvider | None = None,
    *,
    golden_answers: Sequence[str] | None = None,
    config: Config | str | os.PathLike[str] | None = None,
) -> RolloutGroup:
    """Roll out one question's group of ``group_size`` trajectories and score them
    (:func:`searchr1.core.evaluation.evaluate`, as smoke and eval do).

    The first turn samples the shared prompt once with ``num_samples = group_size``; after it
    every trajectory advances on its own (the reference setup's rule). ``max_search_calls`` overrides
    ``[rollout] max_search_calls``; ``search_client`` (a :class:`ZhihuSearchClient` or any
    search provider) replaces the config's ``[search]`` and is left open for the caller to
    read its rates. The model provider is created from the config for this call, in the
    caller's event loop (the load blocks it), and closed after it."""
    from searchr1.core.evaluation import evaluate_run
    from searchr1.core.plugins import load_registry
    from searchr1.core.runs import Run
    from searchr1.defaults import DEFAULT_ANSWERS, DEFAULT_QUESTION

    if group_size < 1:
        raise ConfigError([f"run_rollout_group: group_size must be >= 1, got {group_size}"])
    registry = load_registry()
    cfg = load_api_config(config, registry)
    if max_search_calls is not None:
        cfg = cfg.replace(rollout={"max_search_calls": int(max_search_calls)})
    if golden_answers is None:
        golden_answers = DEFAULT_ANSWERS if question.strip() == DEFAULT_QUESTION else ()
    answers = tuple(golden_answers)
    given = (
        search_client.provider if isinstance(search_client, ZhihuSearchClient) else search_client
    )
    asked = Question(id="api", question=question, golden_answers=answers)
    # The model loads in the caller's loop (blocking it meanwhile): its clients belong to it.
    # A remote reward (the LLM judge) is asked once first: a RemoteError names it at once.
    run = await Run(cfg, registry).start(search=given, check=asked)
    try:
        evaluated = await evaluate_run(
            run.env,
            [asked],
            label="api",
            group_size=group_size,
            greedy=False,  # the policy as training samples it
            seeded=False,
            id_prefix="",
            keep_trajectories=True,
        )
    finally:
        await run.aclose()
        if search_client is None:
            await run.search.aclose()
    return RolloutGroup(
        question=question, golden_answers=answers, trajectories=_trajectory_results(evaluated)
    )


def _trajectory_results(evaluated: EvalResult) -> tuple[TrajectoryResult, ...]:
    """Each scored trajectory of an evaluation, as the API returns it."""
    return tuple(
        TrajectoryResult(
            reward=record.reward,
            search_calls=traj.search_calls,
            final_answer=traj.final_answer,
            components=dict(record.reward_result.components),
            trajectory=traj,
        )
        for record, traj in zip(evaluated.records, evaluated.trajectories, strict=True)
    )


# The reference setup's script checks TAOTOKEN_API_KEY before it calls anything: load ./.env now, with
# the same rule as config files (set variables win; exported-but-empty ones are filled).
_DOTENV_WARNINGS = load_dotenv_files(Path.cwd())
