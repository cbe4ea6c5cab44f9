"""Built-in step monitors: ``health`` (the ``health/*`` metrics and the collapse and mismatch
alerts, settings in ``[train.health]``) and ``run_notices`` (once-per-run warnings: steps
that train no token, turns and trajectories cut by a token limit; counts in ``train_done``).

Registered through the ``searchr1`` entry point like any third-party plugin and chosen by
``[train] monitors``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from searchr1.core.config_validate import plugin_settings
from searchr1.core.hookspecs import hookimpl
from searchr1.plugins.monitors.health import HealthMonitor, HealthSettings
from searchr1.plugins.monitors.run_notices import RunNotices

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config
    from searchr1.core.types import StepMonitor


def _health(config: Config) -> HealthMonitor:
    return HealthMonitor(plugin_settings(config, "train", "health", HealthSettings))


def _run_notices(config: Config) -> RunNotices:
    return RunNotices(config)


@hookimpl
def register_step_monitors(
    register: Callable[[str, Callable[[Config], StepMonitor]], None],
) -> None:
    register("health", _health, settings=HealthSettings)
    register("run_notices", _run_notices)
