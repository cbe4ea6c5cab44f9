"""Built-in policy losses: ``importance_sampling``, ``ppo`` and ``cispo``.

Registered through the ``searchr1`` entry point like any third-party plugin and chosen by
``[train] loss_fn``. Each is a small pure function over per-position tensors (Tinker
semantics, ``../shared/reference/protocols.md`` §5): the loss is a **sum** over positions,
``r_T = exp(logprobs_T - sampler_logprobs_T)``, and positions with advantage 0 (prompt and
observation tokens) contribute nothing. Clip bounds come from ``[train.loss]``
(``clip_low``, ``clip_high``; 0.2 each by default).

Metrics are sums over trained positions (advantage != 0), so a provider can add them across
micro-batches and divide by ``tokens`` once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING

from searchr1.core.config import plugin_settings
from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import LossInputs, LossOutput

if TYPE_CHECKING:
    import torch

    from searchr1.core.config import Config


def _ratio_metrics(
    ratio_T: torch.Tensor, trained_T: torch.Tensor, clipped_T: torch.Tensor | None
) -> dict[str, float]:
    trained = trained_T.float()
    metrics = {
        "tokens": float(trained.sum()),
        "ratio_sum": float((ratio_T.detach() * trained).sum()),
        "ratio_max": float((ratio_T.detach() * trained).max()) if trained.numel() else 0.0,
    }
    if clipped_T is not None:
        metrics["clipped_tokens"] = float((clipped_T & trained_T).float().sum())
    return metrics


def importance_sampling(logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """``loss = -sum_t r_t * A_t`` with ``r_t = exp(lp_t - lp_sampler_t)``.

    The gradient is the off-policy corrected policy gradient
    ``-sum_t r_t * A_t * grad lp_t``; on-policy (``r = 1``) it is REINFORCE."""
    ratio_T = (logprobs_T - inputs.sampler_logprobs_T).exp()
    loss = -(ratio_T * inputs.advantages_T).sum()
    return LossOutput(loss, _ratio_metrics(ratio_T, inputs.advantages_T != 0, None))


def ppo(
    logprobs_T: torch.Tensor, inputs: LossInputs, clip_low: float = 0.2, clip_high: float = 0.2
) -> LossOutput:
    """``loss = -sum_t min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)``."""
    import torch

    ratio_T = (logprobs_T - inputs.sampler_logprobs_T).exp()
    unclipped_T = ratio_T * inputs.advantages_T
    clipped_ratio_T = ratio_T.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped_T = clipped_ratio_T * inputs.advantages_T
    loss = -torch.minimum(unclipped_T, clipped_T).sum()
    was_clipped_T = (clipped_T < unclipped_T).detach()
    return LossOutput(loss, _ratio_metrics(ratio_T, inputs.advantages_T != 0, was_clipped_T))


def cispo(
    logprobs_T: torch.Tensor, inputs: LossInputs, clip_low: float = 0.2, clip_high: float = 0.2
) -> LossOutput:
    """``loss = -sum_t sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * lp_t * A_t``.

    The clipped ratio is a constant weight (stop-gradient), so every token keeps a gradient
    through ``lp_t`` even when its ratio is clipped."""
    ratio_T = (logprobs_T - inputs.sampler_logprobs_T).exp()
    weight_T = ratio_T.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -(weight_T * logprobs_T * inputs.advantages_T).sum()
    was_clipped_T = (weight_T != ratio_T).detach()
    return LossOutput(loss, _ratio_metrics(ratio_T, inputs.advantages_T != 0, was_clipped_T))


@dataclass(frozen=True)
class ClipSettings:
    """``[train.loss]``: clip bounds of ppo and cispo."""

    clip_low: float = 0.2
    clip_high: float = 0.2


@dataclass(frozen=True)
class NamedLoss:
    """A loss function with the name it is registered under (remote services get the name)."""

    name: str
    fn: Callable[..., LossOutput]

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
        return self.fn(logprobs_T, inputs)


def _clip_settings(config: Config) -> dict[str, float]:
    """``[train.loss]`` as keyword arguments of :func:`ppo` / :func:`cispo`."""
    return asdict(plugin_settings(config, "train", "loss", ClipSettings))


@hookimpl
def register_loss_fns(register: Callable[[str, Callable[[Config], NamedLoss]], None]) -> None:
    register(
        "importance_sampling", lambda config: NamedLoss("importance_sampling", importance_sampling)
    )
    register("ppo", lambda config: NamedLoss("ppo", partial(ppo, **_clip_settings(config))))
    register("cispo", lambda config: NamedLoss("cispo", partial(cispo, **_clip_settings(config))))
