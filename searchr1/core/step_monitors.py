"""The run's ``[train] monitors``: asked once per step, states checkpointed, totals in
``train_done``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searchr1.core.config_schema import Config
from searchr1.core.errors import PluginError
from searchr1.core.plugins import Registry
from searchr1.core.types import Alert, StepMonitor, StepRecord

#: keys of a checkpoint's state the core writes itself; a monitor's state sits beside them
RESERVED = frozenset({"step", "python_rng", "data"})


@dataclass(frozen=True)
class Monitors:
    """The listed monitors by name, in ``[train] monitors`` order."""

    by_name: dict[str, StepMonitor]

    def observe(self, record: StepRecord) -> tuple[dict[str, float], list[Alert]]:
        """Every monitor's metrics (merged) and alerts (in list order) for one step."""
        metrics: dict[str, float] = {}
        alerts: list[Alert] = []
        for monitor in self.by_name.values():
            m, a = monitor.observe(record)
            metrics.update(m)
            alerts.extend(a)
        return metrics, alerts

    def state(self) -> dict[str, Any]:
        return {name: monitor.state() for name, monitor in self.by_name.items()}

    def load_state(self, saved: Mapping[str, Any]) -> None:
        """Hand each monitor its part of a checkpoint's state (``{}`` when it has none)."""
        for name, monitor in self.by_name.items():
            monitor.load_state(saved.get(name) or {})

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for monitor in self.by_name.values():
            out.update(monitor.totals())
        return out


def open_monitors(config: Config, registry: Registry) -> Monitors:
    """Create every monitor ``[train] monitors`` lists; PluginError for a reserved name or
    an object that is not a :class:`~searchr1.core.types.StepMonitor`."""
    for name in config.train.monitors:
        if name in RESERVED:
            raise PluginError(
                f"train.monitors lists {name!r}, a key the checkpoint's state keeps for the "
                f"core ({', '.join(sorted(RESERVED))}); register the monitor under another name"
            )
    names = config.train.monitors
    monitors = registry.create_listed("step_monitor", names, StepMonitor, config)
    return Monitors(dict(zip(names, monitors, strict=True)))
