"""Built-in train stages (``[train] stages``): ``heldout_eval`` and ``cold_start``, registered
like any third-party plugin."""

from __future__ import annotations

from collections.abc import Callable

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import TrainStageFactory


@hookimpl
def register_train_stages(register: Callable[[str, TrainStageFactory], None]) -> None:
    from searchr1.plugins.train_stages.cold_start import ColdStart
    from searchr1.plugins.train_stages.heldout_eval import HeldoutEval

    register("heldout_eval", HeldoutEval)
    register("cold_start", ColdStart)
