"""What a command asks of a model provider before it runs: a trainer, and a loss it can train.

Read from the declared contract only (:class:`~searchr1.core.types.Model`,
:class:`~searchr1.core.types.TrainerCapabilities`). :func:`require_trainer` is called by
:func:`searchr1.core.runs.build_components` for ``searchr1 train``; :func:`check_loss` there
for ``train.loss_fn`` and by :func:`searchr1.core.cold_start.cold_start_loss` for
``cold_start.loss_fn``, both before any rollout. A trainer may call :func:`check_loss` itself
for callers that skipped the build (it raises the same error).
"""

from __future__ import annotations

from searchr1.core.errors import ConfigError
from searchr1.core.types import LossFn, Model, Trainer, TrainerCapabilities


def require_trainer(model: Model, provider: str, command: str = "searchr1 train") -> Trainer:
    """The model's trainer; a ConfigError naming ``model.provider`` when it only samples."""
    if model.trainer is None:
        raise ConfigError(
            [
                f"model.provider = {provider!r} only samples (its factory returns no "
                f"trainer), so {command} cannot train with it; use it with searchr1 smoke or "
                f"searchr1 eval, or choose a provider that trains"
            ]
        )
    return model.trainer


def check_loss(
    capabilities: TrainerCapabilities, loss_fn: LossFn, *, field: str, provider: str
) -> None:
    """Raise ConfigError (every problem, one per line) when a trainer with ``capabilities``
    cannot train with ``loss_fn``, the loss that the config field ``field`` (e.g.
    ``train.loss_fn``) chose: a name it does not know, or a setting it does not honour that
    is not 0 (off)."""
    losses = capabilities.losses
    if losses is None:
        return
    name, why = loss_fn.name, capabilities.losses_reason
    reason = f" ({why})" if why else ""
    honoured = losses.get(name)
    if honoured is None:
        raise ConfigError(
            [
                f"{field} = {name!r}: model.provider = {provider!r} trains only "
                f"{', '.join(losses) or 'no loss'}{reason}; choose one of them, or a provider "
                f"that runs the loss function itself"
            ]
        )
    problems = [
        f"{field} = {name!r} is built with {key} = {value:g}, which model.provider = "
        f"{provider!r} does not honour{reason}; it takes "
        f"{', '.join(sorted(honoured)) or 'no settings'} for {name!r}: set {key} = 0 (off) "
        f"where the loss reads its settings ([train.loss] for the built-in losses), or choose "
        f"a provider that runs the loss function itself"
        for key, value in sorted(loss_fn.settings.items())
        if key not in honoured and float(value) != 0.0
    ]
    if problems:
        raise ConfigError(problems)
