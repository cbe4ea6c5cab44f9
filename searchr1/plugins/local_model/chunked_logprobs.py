"""Log-probs of trained tokens without a batch x positions x vocabulary logits tensor.

:class:`~searchr1.plugins.local_model.learner.Learner` calls :func:`chunked_token_logprobs`
for every micro-batch (``[model.local] learner_logit_chunk`` > 0, the default). The
decoder runs over every position as before, but only the final hidden states of trained
positions (each row's own, no union of columns across rows) reach the vocabulary
projection, and that projection runs ``chunk`` positions at a time under activation
checkpointing: in backward each chunk's logits are recomputed from its hidden states, so the
extra memory is a few ``chunk x V`` tensors whatever the micro-batch (with a 248,320
vocabulary, 256 positions are 254 MB per fp32 copy, against 0.9 GB per copy for 19 datums x
50 union columns on the old path).

The model's own logit scaling after ``lm_head`` is applied by :func:`logit_scaling`, from
the transformers architectures that have one (read from their modeling code, transformers
5.24): Gemma-style tanh soft-capping (``final_logit_softcapping``), Cohere's ``logit_scale``,
Granite's division by ``logits_scaling`` (MiniCPM3 divides the hidden states by it, the same
for a bias-free head), HyperCLOVA X's multiplication by it, Falcon-H1's
``lm_head_multiplier``. Architectures not in that table are taken as unscaled (Llama, Qwen,
Mistral, ...); one that scales otherwise (e.g. Mistral-Large-4's, Inkling2's or
MuseSpark's soft-caps, not handled here) is caught by
:func:`matches_model_logits`, which the learner runs once on the first micro-batch: it
compares this path with the model's own ``logits_to_keep`` forward, and on a mismatch the
learner keeps the old path (:func:`~searchr1.plugins.local_model.learner.trained_token_logprobs`)
and logs ``learner_logits_fallback``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

Scaling = Callable[[torch.Tensor], torch.Tensor]

# model_type -> how its CausalLM forward rescales ``lm_head``'s output.
_SOFTCAP = {
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma3n",
    "gemma3n_text",
    "gemma4",
    "gemma4_text",
    "vaultgemma",
    "nanochat",
}
_COHERE = {"cohere", "cohere2", "cohere2_moe"}
# MiniCPM3 divides the hidden states before a bias-free lm_head: the same thing.
_DIVIDE_LOGITS_SCALING = {
    "granite",
    "granitemoe",
    "granitemoehybrid",
    "granitemoeshared",
    "minicpm3",
}
_MULTIPLY_LOGITS_SCALING = {"hyperclovax"}
_FALCON_H1 = {"falcon_h1"}


def causal_lm(model: Any) -> Any:
    """The transformers ``...ForCausalLM`` under a peft wrapper (``model`` itself if bare)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def logit_scaling(model: Any) -> Scaling | None:
    """What ``model``'s forward applies to ``lm_head``'s output, or ``None`` for nothing.

    Known architectures only (module docstring); any other is taken as unscaled, which
    :func:`matches_model_logits` then verifies."""
    lm = causal_lm(model)
    config = lm.config
    kind = getattr(config, "model_type", "")
    text = getattr(config, "get_text_config", lambda: config)()
    if kind in _SOFTCAP:
        cap = getattr(text, "final_logit_softcapping", None)
        if cap is None:
            return None
        return lambda x: torch.tanh(x / cap) * cap
    if kind in _COHERE:
        scale = float(getattr(lm, "logit_scale", text.logit_scale))
        return lambda x: x * scale
    if kind in _DIVIDE_LOGITS_SCALING:
        divisor = float(text.logits_scaling)
        return lambda x: x / divisor
    if kind in _MULTIPLY_LOGITS_SCALING:
        factor = float(text.logits_scaling)
        return lambda x: x * factor
    if kind in _FALCON_H1:
        factor = float(lm.model.lm_head_multiplier)
        return lambda x: x * factor
    return None


def final_hidden_states(
    model: Any, input_ids_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden states (after its final norm), ``B x T x H``: what the
    model's ``lm_head`` reads."""
    decoder = causal_lm(model).get_decoder()
    out = decoder(input_ids=input_ids_BT, attention_mask=mask_BT, use_cache=False)
    return out.last_hidden_state


def chunked_token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    targets_BT: torch.Tensor,
    temperature: float,
    trained_BT: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """``log_softmax(scaled logits / temperature)[target]`` at the positions where
    ``trained_BT`` is true, as one vector ``N`` in row-major order (``x_BT[trained_BT]``).

    Only those positions' hidden states are projected onto the vocabulary, ``chunk`` at a
    time, each chunk recomputed in backward (module docstring)."""
    if chunk < 1:
        raise ValueError(f"learner_logit_chunk must be >= 1 here, got {chunk}")
    hidden_BTH = final_hidden_states(model, input_ids_BT, mask_BT)
    hidden_NH = hidden_BTH[trained_BT]
    targets_N = targets_BT[trained_BT]
    head = causal_lm(model).get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(causal_lm(model)).__name__} has no output embeddings (lm_head)")
    scaling = logit_scaling(model)

    def piece(hidden_CH: torch.Tensor, targets_C: torch.Tensor) -> torch.Tensor:
        logits_CV = head(hidden_CH)
        if scaling is not None:
            logits_CV = scaling(logits_CV)
        scaled_CV = logits_CV.float() / temperature
        target_C = scaled_CV.gather(-1, targets_C[:, None]).squeeze(-1)
        return target_C - torch.logsumexp(scaled_CV, dim=-1)

    # Without autograd (a no-grad scoring pass) there is nothing to recompute.
    recompute = torch.is_grad_enabled() and hidden_NH.requires_grad
    pieces: list[torch.Tensor] = []
    for start in range(0, hidden_NH.shape[0], chunk):
        h_CH, t_C = hidden_NH[start : start + chunk], targets_N[start : start + chunk]
        if recompute:
            pieces.append(checkpoint(piece, h_CH, t_C, use_reentrant=False))
        else:
            pieces.append(piece(h_CH, t_C))
    if not pieces:
        return hidden_NH.new_zeros((0,), dtype=torch.float32)
    return torch.cat(pieces)


def matches_model_logits(
    model: Any,
    input_ids_T: torch.Tensor,
    targets_T: torch.Tensor,
    positions_K: torch.Tensor,
    temperature: float,
) -> tuple[bool, float]:
    """Whether :func:`chunked_token_logprobs` gives the model's own log-probs (its forward
    with ``logits_to_keep``, i.e. with whatever logit scaling it applies) on one row at
    ``positions_K``. Returns (match, max |difference|); no gradient.

    The tolerance is far above float noise (1e-3 in fp32, 0.25 in half precision, where a
    bf16 logit near 16 rounds to 0.06) and far below what a missed scaling does (a Gemma
    soft-cap of 30 moves a logit of 20 by 2.5, Cohere's 0.0625 or Granite's 1/8 more)."""
    ids_1T, targets_1T = input_ids_T[None], targets_T[None]
    mask_1T = torch.ones_like(ids_1T)
    trained_1T = torch.zeros_like(ids_1T, dtype=torch.bool)
    trained_1T[0, positions_K] = True
    with torch.no_grad():
        ours_K = chunked_token_logprobs(
            model,
            ids_1T,
            mask_1T,
            targets_1T,
            temperature,
            trained_1T,
            chunk=max(1, len(positions_K)),
        )
        logits_1KV = model(
            input_ids=ids_1T, attention_mask=mask_1T, use_cache=False, logits_to_keep=positions_K
        ).logits
        scaled_KV = logits_1KV[0].float() / temperature
        theirs_K = scaled_KV.gather(-1, targets_T[positions_K][:, None]).squeeze(-1)
        theirs_K = theirs_K - torch.logsumexp(scaled_KV, dim=-1)
    diff = float((ours_K - theirs_K).abs().max()) if len(positions_K) else 0.0
    dtype = logits_1KV.dtype
    tolerance = 1e-3 if dtype in (torch.float32, torch.float64) else 0.25
    return (math.isfinite(diff) and diff <= tolerance), diff
