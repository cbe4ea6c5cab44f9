"""searchr1's values as the SDK's request types, and the SDK's samples as searchr1's.

Pure functions, called by :class:`~searchr1.plugins.remote_model.provider.RemoteModelProvider`
for every request. Both SDKs (``pytrio``, ``tinker``) take the same shapes, so nothing here
depends on which one is in use beyond the module passed in.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from searchr1.core.types import Datum, SampledSequence, SamplingParams, StopReason, Tokenizer
from searchr1.plugins.remote_model.errors import RemoteServiceError


def sdk_datum(sdk: ModuleType, datum: Datum, loss_scale: float) -> Any:
    """An SDK ``Datum``: ``model_input = input_tokens``, ``loss_fn_inputs = {target_tokens,
    logprobs, advantages}``. ``loss_scale`` multiplies the advantages, because the policy
    losses take no per-token weights (PyTRIO drops ``weights`` for them); the built-in losses
    are linear (``ppo``: positively homogeneous) in the advantage, so this scales loss and
    gradient exactly."""
    import numpy as np

    return sdk.Datum(
        model_input=sdk.ModelInput.from_ints(list(datum.input_tokens)),
        loss_fn_inputs={
            "target_tokens": np.asarray(datum.target_tokens, dtype=np.int64),
            "logprobs": np.asarray(datum.sampler_logprobs, dtype=np.float32),
            "advantages": np.asarray(datum.advantages, dtype=np.float64) * loss_scale,
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
    """One SDK ``SampledSequence`` as searchr1's; every token must come with its log-prob."""
    tokens = tuple(int(t) for t in seq.tokens)
    logprobs = tuple(float(x) for x in (seq.logprobs or ()))
    if len(logprobs) != len(tokens):
        raise RemoteServiceError(
            f"the service returned {len(tokens)} tokens but {len(logprobs)} log-probs for one "
            f"sample; the trainer needs one sampler log-prob per token"
        )
    return SampledSequence(
        tokens=tokens, logprobs=logprobs, stop_reason=stop_reason(seq.stop_reason)
    )
