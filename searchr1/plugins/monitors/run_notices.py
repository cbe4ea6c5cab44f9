"""The ``run_notices`` step monitor: conditions of a training run that deserve one warning,
not one per step. Alerts are logged as ``health_alert`` warnings, each kind the first step it
happens; :meth:`RunNotices.totals` goes into ``train_done``. Kinds: ``no_tokens_trained``
(every kept group degenerate, so the update changed nothing), ``max_new_tokens`` and
``max_trajectory_tokens`` (:mod:`searchr1.kit.token_limits`). The counts and the kinds
already raised are saved in checkpoints, so a resumed run warns and counts like an
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from searchr1.core.types import Alert, StepRecord
from searchr1.kit.token_limits import limit_hits

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config


@dataclass
class RunNotices:
    """Run-long counts of the notices' conditions and which kinds were already raised."""

    config: Config
    counts: dict[str, int] = field(default_factory=dict)
    raised: set[str] = field(default_factory=set)

    def observe(self, record: StepRecord) -> tuple[dict[str, float], list[Alert]]:
        """This step's notices (no metrics)."""
        cfg, step, groups = self.config, record.step, record.groups
        out: list[Alert] = []
        if groups and all(g.degenerate for g in groups):
            hint = (
                "raise rollout.max_extra_draws (dynamic sampling draws fresh questions for "
                "degenerate groups)"
                if cfg.rollout.dynamic_sampling
                else "set rollout.dynamic_sampling = true (fresh questions replace degenerate "
                "groups)"
            )
            out += self._count(
                "no_tokens_trained",
                1,
                f"step {step} trained no token: all {len(groups)} of its groups were "
                f"degenerate (every trajectory of a group got the same reward, so every "
                f"advantage is 0) and the update changed nothing. {hint[0].upper()}{hint[1:]}, "
                f"or raise rollout.group_size or model.temperature",
            )
        hits = limit_hits(
            record.trajectories,
            max_new_tokens=cfg.model.max_new_tokens,
            max_trajectory_tokens=cfg.rollout.max_trajectory_tokens,
        )
        sentences = iter(hits.sentences())
        if hits.turns_cut:
            out += self._count("max_new_tokens", hits.turns_cut, f"step {step}: {next(sentences)}")
        if hits.trajectories_cut:
            out += self._count(
                "max_trajectory_tokens", hits.trajectories_cut, f"step {step}: {next(sentences)}"
            )
        return {}, out

    def _count(self, kind: str, n: int, message: str) -> list[Alert]:
        self.counts[kind] = self.counts.get(kind, 0) + n
        if kind in self.raised:
            return []
        self.raised.add(kind)
        return [Alert(kind, f"{message} (warned once per run; the total is in train_done)")]

    def state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "raised": sorted(self.raised)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
        self.raised = {str(k) for k in state.get("raised", [])}

    def totals(self) -> dict[str, int]:
        """The run's counts (only those that happened), for ``train_done``."""
        names = {
            "no_tokens_trained": "steps_without_training",
            "max_new_tokens": "turns_cut_at_max_new_tokens",
            "max_trajectory_tokens": "trajectories_cut_at_max_trajectory_tokens",
        }
        return {names[k]: v for k, v in self.counts.items()}
