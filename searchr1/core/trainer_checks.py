"""What a command asks of a model provider before any rollout: a trainer, and a loss it can
train, read from the declared contract only (:class:`~searchr1.core.types.TrainerCapabilities`).
A trainer may call :func:`check_loss` itself (it raises the same error)."""

from __future__ import annotations

from searchr1.core.errors import ConfigError
from searchr1.core.types import LossFn, Model, Trainer, TrainerCapabilities, kl_coef


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
    """Raise ConfigError (one problem per line) when ``capabilities`` cannot train
    ``loss_fn``, chosen by config field ``field``: an unknown name, or an unhonoured
    setting that is not 0."""
    kl = kl_coef(loss_fn)
    if kl > 0 and capabilities.kl_reference is None:
        raise ConfigError(
            [
                f"train.loss.kl_coef = {kl:g}: model.provider = {provider!r} cannot "
                f"score the reference policy (the policy as RL began) that the KL term "
                f"needs; set [train.loss] kl_coef = 0, or train with a provider that can "
                f'(model.provider = "local")'
            ]
        )
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
