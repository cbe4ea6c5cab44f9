"""Which losses a Tinker-shaped service computes, and what is sent with their names.

A remote service cannot run a Python loss: it is sent :attr:`LossFn.name` and a
``loss_fn_config`` built from :attr:`LossFn.settings`. :data:`REMOTE_LOSSES` and
:data:`LOSSES_REASON` are what :attr:`RemoteModelProvider.capabilities` declares, so the core
refuses any other loss when the run is built (:func:`searchr1.core.trainer_checks.check_loss`,
before any rollout) with a ConfigError naming the config field that chose it.
:func:`loss_config` is called by every remote ``forward_backward``.
"""

from __future__ import annotations

from collections.abc import Mapping

from searchr1.core.types import LossFn

#: the policy losses a Tinker-shaped service computes by name, each with the settings of
#: ``[train.loss]`` it can be told; any other setting must be 0 (``ratio_cap``: the service
#: applies no truncated importance-sampling cap)
REMOTE_LOSSES: Mapping[str, frozenset[str]] = {
    "importance_sampling": frozenset(),
    "ppo": frozenset({"clip_low", "clip_high"}),
    "cispo": frozenset({"clip_low", "clip_high"}),
}

#: why only those, for the error that refuses another loss or setting
LOSSES_REASON = (
    "it sends the loss's name and clip bounds to a remote service, which computes the loss "
    "itself and applies no truncated importance-sampling cap"
)


def loss_config(loss_fn: LossFn) -> dict[str, float] | None:
    """Clip bounds of ppo/cispo as Tinker's ``loss_fn_config`` (ratio thresholds: the ratio is
    clipped to ``[clip_low_threshold, clip_high_threshold]``); None for a loss without them."""
    settings = loss_fn.settings
    if "clip_low" in settings and "clip_high" in settings:
        return {
            "clip_low_threshold": 1.0 - float(settings["clip_low"]),
            "clip_high_threshold": 1.0 + float(settings["clip_high"]),
        }
    return None
