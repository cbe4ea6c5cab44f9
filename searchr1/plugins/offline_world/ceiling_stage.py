"""The ``ceiling`` train stage: when the held-out set is the world's own
(``data.eval = "builtin:world/..."``, with ``train.eval_before_after``), the scripted ideal
agent plays it before step 1 (``when = "ceiling"``): the EM a perfect searcher reaches with
this run's search provider, protocol and limits."""

from __future__ import annotations

from searchr1.core.assets import asset_name, is_builtin
from searchr1.core.config_schema import Config
from searchr1.core.evaluation import heldout_eval, heldout_questions
from searchr1.core.logs import get_logger
from searchr1.core.types import StageRun


class CeilingStage:
    def __init__(self, config: Config):
        spec = config.data.eval
        ours = is_builtin(spec) and asset_name(spec) == "world"
        self.questions = heldout_questions(config) if ours else []

    def check(self, run: StageRun) -> None:
        """Nothing to check."""

    def before_steps(self, run: StageRun) -> bool:
        from searchr1.plugins.offline_world.ideal_agent import ideal_agent_for

        if not self.questions:
            return False
        ideal = ideal_agent_for(run.config, run.sampler.tokenizer, run.protocol)
        if ideal is None:
            return False
        try:
            heldout_eval(run, self.questions, "ceiling", sampler=ideal)
        except ValueError as exc:  # e.g. a protocol it cannot play
            get_logger().warning("ceiling_skipped", reason=str(exc))
        return False

    def after_steps(self, run: StageRun, step: int) -> None:
        """Nothing after RL."""
