"""Built-in losses: the policy losses ``importance_sampling``, ``ppo`` and ``cispo``, and
``cross_entropy``, the supervised loss of the cold-start stage (``[train.cold_start] loss_fn``).

Registered through the ``searchr1`` entry point like any third-party plugin and chosen by
``[train] loss_fn``. Each is a small pure function over per-position tensors (Tinker
semantics, ``docs/protocols.md`` §5): the loss is a **sum** over positions,
``r_T = exp(logprobs_T - sampler_logprobs_T)``, and positions with advantage 0 (prompt and
observation tokens) contribute nothing. Clip bounds come from ``[train.loss]``
(``clip_low``, ``clip_high``; 0.2 each by default).

Truncated importance sampling (``[train.loss] ratio_cap = C``, off by default; verl's
``tis_imp_ratio_cap`` and slime's TIS are the same idea): every loss uses
``min(r_t, C)`` in place of ``r_t`` as the weight of a token, *keeping* the gradient of that
token (``min(r_t, C) * A_t * grad lp_t``) instead of dropping it as a clip does. It bounds the
variance that a learner/sampler mismatch (bf16, an engine sampler such as vLLM, an untempered
remote learner) adds when a few tokens get a large ratio; ``mismatch/ratio_max`` in the step's
metrics shows whether it is needed (a cap of 2 to 5 is usual). ``truncated_tokens`` counts the
capped tokens. Local learners only: a remote service is sent the loss name and clip bounds
(a remote provider refuses ``ratio_cap > 0`` when the run is built).

KL toward the start policy (``[train.loss] kl_coef = beta``, off by default; verl's
``kl_loss_coef``, TRL's ``beta``): every policy loss adds ``beta * sum_t k3_t`` over every token
it is given, with the k3 estimator ``k3_t = exp(ref_t - lp_t) - (ref_t - lp_t) - 1`` of
``KL(policy || reference)`` on the sampled tokens (``>= 0``, 0 exactly where the two agree;
its gradient ``(1 - exp(ref_t - lp_t)) * grad lp_t`` pulls ``lp_t`` toward ``ref_t``). The
reference is the policy as RL began (``LossInputs.reference_logprobs_T``: the learner's
reference policy, ``searchr1/plugins/local_model/reference.py``). The tokens are every token
the policy sampled in the step, those of degenerate groups (advantage 0) included, as verl and
TRL apply it over the whole response: a skill the policy has mastered gives all-equal rewards,
so its groups carry no policy gradient, and the KL term is what keeps RL from eroding it while
other groups pull the shared weights. It is summed like the policy term, so the step's
``1 / N`` scale applies to both. Metrics: ``kl_sum``, ``kl_tokens`` and ``kl_max`` (the
step reports ``kl/mean`` and ``kl/max``). Only trainers that declare
``kl_reference`` take it (a remote service is refused before any rollout).

Aggregation (``[train] loss_agg_mode``): each position's term, the KL term's included, is
multiplied by its datum's weight (:attr:`LossInputs.weights_T`, set by the core from the
mode: :func:`~searchr1.core.advantages.aggregation_weight`; 1 by default) before the sum
(:func:`total`). GSPO (``[train.loss] importance_sampling_level = "sequence"``): every policy
loss takes its ratio from :func:`importance_ratio`, one value per datum
(:attr:`LossInputs.sequence_T`); local learners only (a remote provider refuses it).

The other metrics are sums over trained positions (advantage != 0), so a provider can add
them across micro-batches and divide by ``tokens`` once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from searchr1.core.config_validate import plugin_settings
from searchr1.core.hookspecs import Register, hookimpl
from searchr1.core.types import LossFactory, LossInputs, LossOutput

if TYPE_CHECKING:
    import torch

    from searchr1.core.config_schema import Config


def _ratio_metrics(
    ratio_T: torch.Tensor,
    trained_T: torch.Tensor,
    clipped_T: torch.Tensor | None,
    ratio_cap: float = 0.0,
) -> dict[str, float]:
    trained = trained_T.float()
    metrics = {
        "tokens": float(trained.sum()),
        "ratio_sum": float((ratio_T.detach() * trained).sum()),
        "ratio_max": float((ratio_T.detach() * trained).max()) if trained.numel() else 0.0,
    }
    if clipped_T is not None:
        metrics["clipped_tokens"] = float((clipped_T & trained_T).float().sum())
    if ratio_cap > 0:
        metrics["truncated_tokens"] = float(((ratio_T.detach() > ratio_cap) & trained_T).sum())
    return metrics


def k3(logprobs_T: torch.Tensor, reference_logprobs_T: torch.Tensor) -> torch.Tensor:
    """Per token ``exp(ref - lp) - (ref - lp) - 1`` (k3 estimator of ``KL(policy || ref)``
    for tokens sampled from the policy); differentiable in ``logprobs_T`` only."""
    d_T = reference_logprobs_T.detach() - logprobs_T
    return d_T.exp() - d_T - 1.0


def kl_penalty(
    logprobs_T: torch.Tensor, inputs: LossInputs, kl_coef: float
) -> tuple[torch.Tensor | float, dict[str, float]]:
    """``(kl_coef * sum of k3 over every given token, {kl_sum, kl_tokens, kl_max})``;
    ``(0, {})`` when ``kl_coef`` is 0."""
    if kl_coef <= 0:
        return 0.0, {}
    if inputs.reference_logprobs_T is None:
        raise ValueError(
            "[train.loss] kl_coef > 0 but the trainer gave no reference log-probs "
            "(LossInputs.reference_logprobs_T); its provider must declare kl_reference"
        )
    k3_T = k3(logprobs_T, inputs.reference_logprobs_T)
    detached = k3_T.detach()
    return kl_coef * total(k3_T, inputs), {
        "kl_sum": float(detached.sum()),
        "kl_tokens": float(detached.numel()),
        "kl_max": float(detached.max()) if detached.numel() else 0.0,
    }


def truncated(ratio_T: torch.Tensor, ratio_cap: float) -> torch.Tensor:
    """``min(r, cap)`` in value, with the gradient of ``r`` scaled by ``min(r, cap) / r``: a
    capped token's gradient is ``cap * grad lp`` (truncated IS), not 0. ``cap <= 0``: ``r``."""
    if ratio_cap <= 0:
        return ratio_T
    # The denominator is at least cap > 0, so a ratio that underflowed to 0 is safe.
    scale_T = (ratio_cap / ratio_T.detach().clamp(min=ratio_cap)).detach()
    return ratio_T * scale_T


def importance_ratio(
    logprobs_T: torch.Tensor, inputs: LossInputs, importance_sampling_level: str = "token"
) -> torch.Tensor:
    """``r_t = exp(lp_t - lp_sampler_t)`` (``"token"``), or GSPO's sequence-level ratio
    (``"sequence"``): in value ``s_i = exp(mean over datum i's positions of (lp - lp_sampler))``
    on each of its tokens, with the gradient ``s_i * grad lp_t`` (``exp(sg(log s_i) + lp_t -
    sg(lp_t))``, verl's form; TRL's ``exp(log s_i)`` has the gradient ``s_i / n_i * grad lp_t``
    on each token, which its per-sequence loss sums back to the same update)."""
    import torch

    log_ratio_T = logprobs_T - inputs.sampler_logprobs_T
    if importance_sampling_level == "token":
        return log_ratio_T.exp()
    seq_T = inputs.sequence_T
    if seq_T is None:
        seq_T = torch.zeros(len(logprobs_T), dtype=torch.long, device=logprobs_T.device)
    n = int(seq_T.max()) + 1 if len(seq_T) else 0
    detached = log_ratio_T.detach()
    sums = torch.zeros(n, dtype=detached.dtype, device=detached.device).index_add_(
        0, seq_T, detached
    )
    counts = torch.zeros_like(sums).index_add_(0, seq_T, torch.ones_like(detached))
    mean_T = (sums / counts.clamp(min=1.0))[seq_T]
    return (mean_T + logprobs_T - logprobs_T.detach()).exp()


def total(terms_T: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """The loss's sum over positions, each term times its datum's weight (the aggregation,
    ``[train] loss_agg_mode``; :attr:`LossInputs.weights_T`)."""
    if inputs.weights_T is None:
        return terms_T.sum()
    return (terms_T * inputs.weights_T).sum()


def importance_sampling(
    logprobs_T: torch.Tensor,
    inputs: LossInputs,
    ratio_cap: float = 0.0,
    kl_coef: float = 0.0,
    importance_sampling_level: str = "token",
) -> LossOutput:
    """``loss = -sum_t r_t * A_t`` with ``r_t = exp(lp_t - lp_sampler_t)`` (``min(r_t, C)``
    with ``ratio_cap = C``; GSPO's sequence ratio with ``importance_sampling_level =
    "sequence"``, :func:`importance_ratio`), plus the KL term (module docstring).

    The gradient is the off-policy corrected policy gradient
    ``-sum_t r_t * A_t * grad lp_t``; on-policy (``r = 1``) it is REINFORCE."""
    ratio_T = importance_ratio(logprobs_T, inputs, importance_sampling_level)
    kl, kl_metrics = kl_penalty(logprobs_T, inputs, kl_coef)
    loss = -total(truncated(ratio_T, ratio_cap) * inputs.advantages_T, inputs) + kl
    metrics = _ratio_metrics(ratio_T, inputs.advantages_T != 0, None, ratio_cap)
    return LossOutput(loss, {**metrics, **kl_metrics})


def ppo(
    logprobs_T: torch.Tensor,
    inputs: LossInputs,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_cap: float = 0.0,
    kl_coef: float = 0.0,
    importance_sampling_level: str = "token",
) -> LossOutput:
    """``loss = -sum_t min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)``; with
    ``ratio_cap = C`` the unclipped term uses ``min(r_t, C)`` (bounding negative-advantage
    tokens, which the clip leaves unbounded); plus the KL term (module docstring). With
    ``importance_sampling_level = "sequence"`` ``r_t`` is GSPO's (:func:`importance_ratio`)."""
    import torch

    ratio_T = importance_ratio(logprobs_T, inputs, importance_sampling_level)
    unclipped_T = truncated(ratio_T, ratio_cap) * inputs.advantages_T
    clipped_ratio_T = ratio_T.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped_T = clipped_ratio_T * inputs.advantages_T
    kl, kl_metrics = kl_penalty(logprobs_T, inputs, kl_coef)
    loss = -total(torch.minimum(unclipped_T, clipped_T), inputs) + kl
    was_clipped_T = (clipped_T < unclipped_T).detach()
    trained_T = inputs.advantages_T != 0
    metrics = _ratio_metrics(ratio_T, trained_T, was_clipped_T, ratio_cap)
    return LossOutput(loss, {**metrics, **kl_metrics})


def cispo(
    logprobs_T: torch.Tensor,
    inputs: LossInputs,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_cap: float = 0.0,
    kl_coef: float = 0.0,
    importance_sampling_level: str = "token",
) -> LossOutput:
    """``loss = -sum_t sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * lp_t * A_t``, plus the KL
    term (module docstring).

    The clipped ratio is a constant weight (stop-gradient), so every token keeps a gradient
    through ``lp_t`` even when its ratio is clipped. ``ratio_cap`` also bounds the weight
    (it only matters when set below ``1 + clip_high``). With ``importance_sampling_level =
    "sequence"`` ``r_t`` is GSPO's (:func:`importance_ratio`)."""
    ratio_T = importance_ratio(logprobs_T, inputs, importance_sampling_level)
    weight_T = truncated(ratio_T.clamp(1.0 - clip_low, 1.0 + clip_high), ratio_cap).detach()
    kl, kl_metrics = kl_penalty(logprobs_T, inputs, kl_coef)
    loss = -total(weight_T * logprobs_T * inputs.advantages_T, inputs) + kl
    was_clipped_T = (weight_T != ratio_T).detach()
    trained_T = inputs.advantages_T != 0
    metrics = _ratio_metrics(ratio_T, trained_T, was_clipped_T, ratio_cap)
    return LossOutput(loss, {**metrics, **kl_metrics})


def cross_entropy(logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
    """``loss = -sum_t A_t * lp_t``: supervised fine-tuning, with each trained token's
    advantage as its weight (the cold start sets 1 on every token the scripted agent wrote, 0
    on prompt and observation tokens, exactly as the RL datums mask them). The sampler
    log-probs play no part (a scripted agent has none)."""
    trained_T = inputs.advantages_T != 0
    loss = -(inputs.advantages_T * logprobs_T).sum()
    nll_sum = float(-(logprobs_T.detach() * trained_T).sum())
    return LossOutput(loss, {"tokens": float(trained_T.float().sum()), "nll_sum": nll_sum})


@dataclass(frozen=True)
class ClipSettings:
    """``[train.loss]``: clip bounds of ppo and cispo, the truncated-IS cap of every loss
    (``ratio_cap``, 0 = off) and the weight of every policy loss's KL term toward the start
    policy (``kl_coef``, 0 = off)."""

    #: ppo/cispo: lower clip of the importance ratio (1 - clip_low)
    clip_low: float = 0.2
    #: ppo/cispo: upper clip of the importance ratio (1 + clip_high)
    clip_high: float = 0.2
    #: truncated importance sampling: min(ratio, C) as each token's weight; 0 = off
    ratio_cap: float = field(default=0.0, metadata={"min": 0.0})
    #: weight of a k3 KL term toward the policy as RL began; 0 = off (local and vllm only)
    kl_coef: float = field(default=0.0, metadata={"min": 0.0})
    #: "token": each token's own ratio; "sequence": GSPO's length-normalised ratio of the
    #: whole trajectory on each of its tokens (TRL's importance_sampling_level; local and
    #: vllm only)
    importance_sampling_level: str = field(
        default="token", metadata={"choices": ("token", "sequence")}
    )


@dataclass(frozen=True)
class NamedLoss:
    """A :class:`~searchr1.core.types.LossFn`: a loss function with the name it is registered
    under and the settings it is called with (``fn(logprobs_T, inputs, **settings)``), so a
    remote provider can send both to its service."""

    name: str
    fn: Callable[..., LossOutput]
    settings: Mapping[str, float | str] = field(default_factory=dict)

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
        return self.fn(logprobs_T, inputs, **self.settings)


def _clip_settings(config: Config) -> dict[str, float | str]:
    """``[train.loss]`` as keyword arguments of :func:`ppo` / :func:`cispo`;
    ``importance_sampling_level`` only when not ``"token"`` (what every trainer does, so a
    remote provider is told it only when it must refuse it)."""
    settings: dict[str, float | str] = asdict(
        plugin_settings(config, "train", "loss", ClipSettings)
    )
    if settings["importance_sampling_level"] == "token":
        del settings["importance_sampling_level"]
    return settings


def _is_settings(config: Config) -> dict[str, float | str]:
    """``[train.loss]`` for :func:`importance_sampling`: all but the clip bounds (checked, but
    meaningless without a clip)."""
    settings = _clip_settings(config)
    return {k: v for k, v in settings.items() if k not in ("clip_low", "clip_high")}


@hookimpl
def register_loss_fns(register: Register[LossFactory]) -> None:
    table = {"loss": ClipSettings}  # [train.loss], checked by config check like any table
    register(
        "importance_sampling",
        lambda config: NamedLoss("importance_sampling", importance_sampling, _is_settings(config)),
        settings=table,
    )
    register("ppo", lambda config: NamedLoss("ppo", ppo, _clip_settings(config)), settings=table)
    register(
        "cispo", lambda config: NamedLoss("cispo", cispo, _clip_settings(config)), settings=table
    )
    register("cross_entropy", lambda config: NamedLoss("cross_entropy", cross_entropy))
