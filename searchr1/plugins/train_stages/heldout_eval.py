"""The ``heldout_eval`` train stage: with ``train.eval_before_after`` and a ``data.eval`` file,
the run's model is evaluated greedily on it before step 1 (``when = "before"``) and after the
last step (``"after"``): ``eval_heldout_<when>.jsonl`` and one ``eval/heldout_em`` event each."""

from __future__ import annotations

from searchr1.core.config_schema import Config
from searchr1.core.evaluation import heldout_eval, heldout_questions
from searchr1.core.types import StageRun


class HeldoutEval:
    def __init__(self, config: Config):
        self.questions = heldout_questions(config)  # a bad data.eval fails before the model loads

    def check(self, run: StageRun) -> None:
        """Nothing to check beyond the file, read when created."""

    def before_steps(self, run: StageRun) -> bool:
        if self.questions:
            heldout_eval(run, self.questions, "before")
        return False

    def after_steps(self, run: StageRun, step: int) -> None:
        if self.questions:
            heldout_eval(run, self.questions, "after", step=step)
