"""Which losses a Tinker-shaped service computes, and what is sent with their names.

A remote service cannot run a Python loss: it is sent :attr:`LossFn.name` and a
``loss_fn_config`` built from :attr:`LossFn.settings`. :func:`check_loss` is what
:meth:`RemoteModelProvider.check_loss` runs when the run is built (from
:func:`searchr1.core.runs.build_components`, before any rollout), so a loss the service does not
know fails with a ConfigError naming ``train.loss_fn`` instead of after a whole rollout.
:func:`loss_config` is called by every remote ``forward_backward``.
"""

from __future__ import annotations

from collections.abc import Mapping

from searchr1.core.errors import ConfigError
from searchr1.core.types import LossFn

#: the policy losses a Tinker-shaped service computes by name, each with the settings of
#: ``[train.loss]`` it can be told (``ratio_cap`` is checked separately: it must be 0)
REMOTE_LOSSES: Mapping[str, frozenset[str]] = {
    "importance_sampling": frozenset(),
    "ppo": frozenset({"clip_low", "clip_high"}),
    "cispo": frozenset({"clip_low", "clip_high"}),
}


def check_loss(loss_fn: LossFn, provider_name: str) -> None:
    """Raise ConfigError (every problem, one per line) when the service cannot train with
    ``loss_fn``: an unknown name, a truncated-IS cap (``ratio_cap > 0``: the service applies
    none), or a setting it cannot be told."""
    name = loss_fn.name
    supported = REMOTE_LOSSES.get(name)
    if supported is None:
        raise ConfigError(
            [
                f"train.loss_fn = {name!r}: provider {provider_name!r} trains on a remote "
                f"service that computes the loss by name and knows only "
                f"{', '.join(REMOTE_LOSSES)}; choose one of them, or the local provider for "
                f"a loss of your own"
            ]
        )
    settings = dict(getattr(loss_fn, "settings", None) or {})
    problems = []
    cap = float(settings.pop("ratio_cap", 0.0) or 0.0)
    if cap > 0:
        problems.append(
            f"[train.loss] ratio_cap = {cap:g}: provider {provider_name!r} sends the loss to a "
            f"remote service, which applies no truncated importance-sampling cap; set "
            f"ratio_cap = 0 (off) or use the local provider"
        )
    unknown = sorted(set(settings) - supported)
    if unknown:
        problems.append(
            f"train.loss_fn = {name!r} carries settings {', '.join(unknown)} that the remote "
            f"service cannot be told (it takes {', '.join(sorted(supported)) or 'none'} for "
            f"{name!r}); remove them or use the local provider"
        )
    if problems:
        raise ConfigError(problems)


def loss_config(loss_fn: LossFn) -> dict[str, float] | None:
    """Clip bounds of ppo/cispo as Tinker's ``loss_fn_config`` (ratio thresholds: the ratio is
    clipped to ``[clip_low_threshold, clip_high_threshold]``); None for a loss without them."""
    settings = getattr(loss_fn, "settings", None) or {}
    if "clip_low" in settings and "clip_high" in settings:
        return {
            "clip_low_threshold": 1.0 - float(settings["clip_low"]),
            "clip_high_threshold": 1.0 + float(settings["clip_high"]),
        }
    return None
