"""Metric sinks: numbers, a few trajectories and the config, sent beyond events.jsonl, always
redacted. A sink never stops training: its first failure is a ``sink_failed`` warning, later
ones are counted; a factory failing for an outside reason (network, disk) drops that sink.
Only user mistakes stop the run at start: an unknown name, a bad ``[log.<name>]`` table, a
missing package (:func:`searchr1.kit.sinks.missing_package`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError, UserError
from searchr1.core.logs import get_logger
from searchr1.core.plugins import PluginError, Registry
from searchr1.core.secrets import redact_text, redact_value
from searchr1.core.types import MetricSink


@dataclass
class _Guarded:
    """One sink plus its failure bookkeeping: warn on the first failure, count the rest."""

    name: str
    sink: MetricSink
    failures: int = 0

    def call(self, method: str, *args: Any) -> None:
        try:
            getattr(self.sink, method)(*args)
        except Exception as exc:  # a sink never stops training
            self.failures += 1
            if self.failures == 1:
                _warn_failed(self.name, method, exc)


def _warn_failed(name: str, method: str, exc: BaseException) -> None:
    get_logger().warning(
        "sink_failed",
        sink=name,
        method=method,
        error=f"{type(exc).__name__}: {exc}",
        hint="training goes on; this sink's later failures are only counted",
    )


@dataclass
class SinkHub:
    """The run's open sinks (none outside ``train``); the train loop calls it with each
    step's metrics, the held-out evals' numbers and a few trajectories, it calls each sink
    (guarded)."""

    sinks: list[_Guarded] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sinks]

    def hparams(self, config: Mapping[str, Any]) -> None:
        for s in self.sinks:
            s.call("log_hparams", config)

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """The numbers of ``values`` (strings and booleans left out) as scalars of ``step``."""
        scalars = {
            k: float(v)
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if scalars:
            for s in self.sinks:
                s.call("log_scalars", step, scalars)

    def texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        for s in self.sinks:
            s.call("log_texts", step, name, list(texts))

    def trajectories(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        """A few dumped trajectories as redacted text."""
        if not self.sinks:
            return
        texts = [redact_text(trajectory_text(r)) for r in records]
        if texts:
            self.texts(step, "trajectories", texts)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for s in sinks:
            s.call("close")
            if s.failures > 1:
                get_logger().warning("sink_failures", sink=s.name, failures=s.failures)


def open_sinks(config: Config, registry: Registry, run_dir: Path) -> SinkHub:
    """Create the ``[log] sinks`` with the redacted config. PluginError, ConfigError and
    UserError propagate; any other factory failure drops that sink with a warning."""
    hub = SinkHub()
    for name in config.log.sinks:
        try:
            sink = registry.create("metric_sink", name, config, run_dir)
        except (PluginError, ConfigError, UserError):
            hub.close()
            raise
        except Exception as exc:
            _warn_failed(name, "open", exc)
            continue
        hub.sinks.append(_Guarded(name, sink))
    if hub.sinks:
        hub.hparams(redact_value(config.to_dict(redact=True)))
    return hub


def trajectory_text(record: Mapping[str, Any], max_chars: int = 4000) -> str:
    """A dumped trajectory record as plain text (turns, shortened search results, reward)."""
    lines = [
        f"question: {record.get('question', '')}",
        f"golden: {' | '.join(record.get('golden_answers', []))}",
    ]
    for i, turn in enumerate(record.get("turns", []), start=1):
        lines.append(f"[turn {i}] {turn.get('text', '').strip()}")
        if turn.get("search_error"):
            lines.append(f"  search error: {turn['search_error']}")
        elif turn.get("observation_text"):
            obs = " ".join(str(turn["observation_text"]).split())
            lines.append(f"  result: {obs[:300]}{'...' if len(obs) > 300 else ''}")
    components = record.get("components") or {}
    parts = ", ".join(f"{k}={v:g}" for k, v in components.items())
    lines.append(
        f"answer: {record.get('final_answer')!r}  end: {record.get('end_reason')}  "
        f"reward: {record.get('reward', float('nan')):g}" + (f" ({parts})" if parts else "")
    )
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
