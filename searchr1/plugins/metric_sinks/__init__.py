"""Built-in metric sinks: ``tensorboard``, ``wandb`` and ``swanlab``.

Registered through the ``searchr1`` entry point like any third-party plugin and chosen by
``[log] sinks``. Each lives in its own module and imports its tracker's package only when
a run asks for it, so listing the plugins never needs the optional packages:
``tensorboard`` ships with searchr1; ``wandb`` and ``swanlab`` are the extras
``pip install 'searchr1[wandb]'`` / ``'searchr1[swanlab]'`` (a missing one is a clear error
at start naming the extra). Settings live in ``[log.<name>]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.sdk import MetricSinkFactory, Register, hookimpl

if TYPE_CHECKING:
    from searchr1.sdk import Config, MetricSink


def _tensorboard(config: Config, run_dir: Path) -> MetricSink:
    from searchr1.plugins.metric_sinks.tensorboard_sink import open_tensorboard

    return open_tensorboard(config, run_dir)


def _wandb(config: Config, run_dir: Path) -> MetricSink:
    from searchr1.plugins.metric_sinks.wandb_sink import open_wandb

    return open_wandb(config, run_dir)


def _swanlab(config: Config, run_dir: Path) -> MetricSink:
    from searchr1.plugins.metric_sinks.swanlab_sink import open_swanlab

    return open_swanlab(config, run_dir)


@hookimpl
def register_metric_sinks(
    register: Register[MetricSinkFactory],
) -> None:
    register("tensorboard", _tensorboard)
    register("wandb", _wandb)
    register("swanlab", _swanlab)
