"""What a command asks of a model provider before any rollout: a trainer, and a loss it can
train, read from the declared contract only (:class:`~searchr1.core.types.TrainerCapabilities`):
the built trainer's, or before the model loads the one its registration declares
(:func:`loss_refusals`). A trainer may call :func:`check_loss` itself (it raises the same
error)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.core.errors import ConfigError, SearchR1Error
from searchr1.core.old_imports import warn_plugins
from searchr1.core.types import LossFn, Model, Trainer, TrainerCapabilities, kl_coef

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config
    from searchr1.core.plugins import Registry


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
    ``loss_fn``, chosen by config field ``field``: a KL term without a reference policy, an
    unknown name, or an unhonoured setting that is not 0."""
    problems = _refusals(capabilities, loss_fn, field, provider)
    if problems:
        raise ConfigError([message for _, message in problems])


def loss_refusals(config: Config, registry: Registry) -> list[str]:
    """What ``train`` refuses in its losses before the model loads, ``file:line: problem``
    each: every loss it will train (``train.loss_fn``; ``train.cold_start.loss_fn`` when
    ``[train.cold_start] steps > 0``) under :func:`check_loss`'s rules against the
    capabilities the chosen model provider declares at registration (``capabilities=``);
    none when it declares none (its trainer is checked once built). ``config check`` says
    the same as warnings, since smoke and eval train nothing."""
    from searchr1.core.config_schema import ColdStartSettings
    from searchr1.core.config_validate import plugin_settings

    reg = registry.entries["model_provider"].get(config.model.provider)
    capabilities = reg.capabilities if reg is not None else None
    if capabilities is None:
        return []
    chosen = [("train.loss_fn", config.train.loss_fn)]
    if (cold_start := plugin_settings(config, "train", "cold_start", ColdStartSettings)).steps:
        chosen.append(("train.cold_start.loss_fn", cold_start.loss_fn))
    out: list[str] = []
    for field, name in chosen:
        try:
            loss_fn = registry.create("loss_fn", name, config)
        except SearchR1Error:  # an unknown name or a bad setting: the config's own checks
            continue
        for dotted, message in _refusals(capabilities, loss_fn, field, config.model.provider):
            out.append(f"{config.where(dotted)}: {message}")
    return list(dict.fromkeys(out))  # both losses may read the same [train.loss] setting


def _refusals(
    capabilities: TrainerCapabilities, loss_fn: LossFn, field: str, provider: str
) -> list[tuple[str, str]]:
    """``(dotted setting, problem)`` for each part of ``loss_fn`` that ``capabilities``
    cannot train (the built-in losses read their settings from ``[train.loss]``)."""
    out = []
    kl = kl_coef(loss_fn)
    if kl > 0 and capabilities.kl_reference is None:
        out.append(
            (
                "train.loss.kl_coef",
                f"train.loss.kl_coef = {kl:g}: model.provider = {provider!r} cannot "
                f"score the reference policy (the policy as RL began) that the KL term "
                f"needs; set [train.loss] kl_coef = 0, or train with a provider that can "
                f'(model.provider = "local")',
            )
        )
    losses = capabilities.losses
    if losses is None:
        return out
    name, why = loss_fn.name, capabilities.losses_reason
    reason = f" ({why})" if why else ""
    honoured = losses.get(name)
    if honoured is None:
        off = (
            "; or set [train.cold_start] steps = 0" if field.startswith("train.cold_start") else ""
        )
        out.append(
            (
                field,
                f"{field} = {name!r}: model.provider = {provider!r} trains only "
                f"{', '.join(losses) or 'no loss'}{reason}; choose one of them, or a provider "
                f"that runs the loss function itself{off}",
            )
        )
        return out
    out += [
        (
            f"train.loss.{key}",
            f"{field} = {name!r} is built with {key} = {_shown(value)}, which model.provider = "
            f"{provider!r} does not honour{reason}; it takes "
            f"{', '.join(sorted(honoured)) or 'no settings'} for {name!r}: set {key} "
            f"{'to its default' if isinstance(value, str) else '= 0 (off)'} where the loss "
            f"reads its settings ([train.loss] for the built-in losses), or choose a provider "
            f"that runs the loss function itself",
        )
        for key, value in sorted(loss_fn.settings.items())
        # a word setting is in a loss's settings only when it is not the default
        if key not in honoured and value != 0 and f"train.loss.{key}" not in dict(out)
    ]
    return out


def _shown(value: float | str) -> str:
    return f'"{value}"' if isinstance(value, str) else f"{value:g}"


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
