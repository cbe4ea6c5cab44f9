"""Built-in train stages (``[train] stages``): ``heldout_eval`` and ``cold_start``, registered
like any third-party plugin."""

from __future__ import annotations

from collections.abc import Callable

from searchr1.core.hookspecs import hookimpl


@hookimpl
def register_train_stages(register: Callable[..., None]) -> None:
    from searchr1.plugins.train_stages.cold_start import ColdStart, ColdStartSettings
    from searchr1.plugins.train_stages.heldout_eval import HeldoutEval

    register("heldout_eval", HeldoutEval)
    # declared, so config check reads the table and the loss name
    register("cold_start", ColdStart, settings=ColdStartSettings)
