"""searchr1's values as the SDK's request types, and the SDK's answers as searchr1's.

Pure functions and constants, used by
:class:`~searchr1.plugins.remote_model.provider.RemoteModelProvider` for every request. Both
SDKs (``pytrio``, ``tinker``) take the same shapes, so nothing here depends on which one is in
use beyond the module passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from searchr1.sdk import (
    Datum,
    ForwardBackwardResult,
    LossFn,
    SampledSequence,
    SamplingParams,
    StopReason,
    Tokenizer,
    TrainerCapabilities,
    mismatch_from_logprobs,
)

#: the ``[lora] target_modules`` of each layer group the service adapts as a whole
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")

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


#: what the remote trainer declares (its ``capabilities``, also declared at registration so
#: ``train`` and ``config check`` refuse another loss, or a KL term, before any login): the
#: losses above and no reference policy to score (the built trainer adds its snapshot sampler)
REMOTE_CAPABILITIES = TrainerCapabilities(losses=REMOTE_LOSSES, losses_reason=LOSSES_REASON)


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


def lora_groups(targets: Sequence[str]) -> dict[str, bool]:
    """``target_modules`` as the SDK's ``train_attn`` / ``train_mlp`` / ``train_unembed``."""
    return {
        "train_attn": any(m in targets for m in ATTENTION),
        "train_mlp": any(m in targets for m in MLP),
        "train_unembed": "lm_head" in targets,
    }


def sdk_datum(sdk: ModuleType, datum: Datum, loss_scale: float) -> Any:
    """An SDK ``Datum``: ``model_input = input_tokens``, ``loss_fn_inputs = {target_tokens,
    logprobs, advantages}``. ``loss_scale`` and the datum's aggregation weight
    (:attr:`~searchr1.core.types.Datum.weight`, ``[train] loss_agg_mode``) multiply the
    advantages, because the policy losses take no per-token weights (PyTRIO drops ``weights``
    for them); the built-in losses are linear (``ppo``: positively homogeneous) in the
    advantage, so this scales loss and gradient exactly (there is no KL term remotely)."""
    import numpy as np

    return sdk.Datum(
        model_input=sdk.ModelInput.from_ints(list(datum.input_tokens)),
        loss_fn_inputs={
            "target_tokens": np.asarray(datum.target_tokens, dtype=np.int64),
            "logprobs": np.asarray(datum.sampler_logprobs, dtype=np.float32),
            "advantages": np.asarray(datum.advantages, dtype=np.float64)
            * (loss_scale * datum.weight),
        },
    )


def sampling_kwargs(params: SamplingParams, tokenizer: Tokenizer) -> dict[str, Any]:
    """Keyword arguments of the SDK's ``SamplingParams``."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.seed is not None:
        kwargs["seed"] = params.seed
    # The SDK's ``stop`` is either strings or token ids, not both: when both are asked
    # for, stop tokens travel as their text (special tokens decode to their literal text).
    if params.stop_strings:
        stops = list(params.stop_strings)
        for token_id in params.stop_token_ids:
            text = tokenizer.decode([token_id], skip_special_tokens=False)
            if text and text not in stops:
                stops.append(text)
        kwargs["stop"] = stops
    elif params.stop_token_ids:
        kwargs["stop"] = list(params.stop_token_ids)
    return kwargs


def stop_reason(value: Any) -> StopReason:
    text = str(getattr(value, "value", value) or "").lower()
    return "length" if text in ("length", "max_tokens", "max_length") else "stop"


def to_sequence(seq: Any) -> SampledSequence:
    """One SDK ``SampledSequence`` as searchr1's; every token must come with its log-prob
    (ValueError otherwise: the provider reports a malformed answer)."""
    tokens = tuple(int(t) for t in seq.tokens)
    logprobs = tuple(float(x) for x in (seq.logprobs or ()))
    if len(logprobs) != len(tokens):
        raise ValueError(
            f"the service returned {len(tokens)} tokens but {len(logprobs)} log-probs for one "
            f"sample; the trainer needs one sampler log-prob per token"
        )
    return SampledSequence(
        tokens=tokens, logprobs=logprobs, stop_reason=stop_reason(seq.stop_reason)
    )


def forward_result(
    output: Any, datums: Sequence[Datum], loss_scale: float
) -> ForwardBackwardResult:
    """The service's loss (unscaled back, as the local provider reports it) plus the metrics
    the local provider reports, recomputed from the per-token log-probs the service returns:
    sums (``tokens``, ``ratio_sum``; the core derives ``ratio_mean`` from them), maxima
    (``ratio_max``, ``logprob_diff_max``: the largest |learner - sampler| log-prob on
    trained positions) and the ``mismatch/*`` metrics
    (:func:`searchr1.core.step_metrics.mismatch_from_logprobs`)."""
    raw = {str(k): v for k, v in (getattr(output, "metrics", None) or {}).items()}
    loss = float(raw.get("loss_sum", raw.get("loss:sum", 0.0))) / loss_scale
    tokens = ratio_sum = ratio_max = diff_max = 0.0
    learner_lps: list[float] = []
    sampler_lps: list[float] = []
    outputs = list(getattr(output, "loss_fn_outputs", None) or [])
    for datum, out in zip(datums, outputs, strict=False):
        logprobs = out.get("logprobs") if isinstance(out, Mapping) else None
        if logprobs is None:
            continue
        values = _floats(logprobs)
        for lp, old, adv in zip(values, datum.sampler_logprobs, datum.advantages, strict=False):
            if adv != 0.0:
                ratio = math.exp(lp - old)
                tokens += 1.0
                ratio_sum += ratio
                ratio_max = max(ratio_max, ratio)
                diff_max = max(diff_max, abs(lp - old))
                learner_lps.append(lp)
                sampler_lps.append(old)
    metrics: dict[str, float] = {"datums": float(len(datums)), "loss": loss}
    if tokens:
        metrics.update(
            tokens=tokens,
            ratio_sum=ratio_sum,
            ratio_max=ratio_max,
            logprob_diff_max=diff_max,
        )
        metrics.update(mismatch_from_logprobs(learner_lps, sampler_lps))
    else:  # the service returned no log-probs: count trained positions ourselves
        metrics["tokens"] = float(sum(1 for d in datums for a in d.advantages if a != 0.0))
    return ForwardBackwardResult(loss=loss, metrics=metrics)


def _floats(values: Any) -> list[float]:
    """Per-token values as floats: a numpy array (PyTRIO), an SDK ``TensorData`` (tinker:
    ``tolist()`` there gives the raw ``data`` list) or a plain list."""
    to_numpy = getattr(values, "to_numpy", None)
    if callable(to_numpy):
        values = to_numpy()
    flat = values.tolist() if hasattr(values, "tolist") else list(values)
    return [float(v) for v in flat]
