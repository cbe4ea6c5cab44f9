"""Log-probs of trained tokens without a batch x positions x vocabulary logits tensor."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class LogitScaling:
    """What a CausalLM forward does to ``lm_head``'s output ``x``: ``multiplier * x``, then,
    with ``softcap``, ``softcap * tanh(. / softcap)`` (Gemma). The identity by default."""

    multiplier: float = 1.0
    softcap: float | None = None

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Out of place (autograd records it)."""
        if self.multiplier != 1.0:
            x = x * self.multiplier
        if self.softcap is not None:
            x = torch.tanh(x / self.softcap) * self.softcap
        return x


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


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 if it is in a lower precision (log-softmax over 248k logits in bf16
    loses digits), as it is otherwise (float64 stays float64, for exactness tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def target_logprobs(
    logits_XV: torch.Tensor, targets_X: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[target]`` over the last dimension, as
    ``logit[target] - logsumexp(logits)``: no second ``... x V`` tensor (the whole
    log-softmax) is kept for backward."""
    scaled_XV = at_least_fp32(logits_XV) / temperature
    target_X = scaled_XV.gather(-1, targets_X[..., None]).squeeze(-1)
    return target_X - torch.logsumexp(scaled_XV, dim=-1)


def causal_lm(model: Any) -> Any:
    """The transformers ``...ForCausalLM`` under a peft wrapper (``model`` itself if bare)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def cache_kwarg(model: Any) -> str:
    """The name of the KV-cache argument of ``model.forward`` (for :class:`Forward`):
    transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns, then
    goes); older releases only know the old one."""
    params = inspect.signature(causal_lm(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` in transformers 5.x, else
    ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def logit_scaling(model: Any) -> LogitScaling:
    """What ``model``'s forward applies to ``lm_head``'s output.

    Known architectures only (module docstring); any other is taken as unscaled, which
    :func:`matches_model_logits` then verifies."""
    lm = causal_lm(model)
    config = lm.config
    kind = getattr(config, "model_type", "")
    text = config.get_text_config()
    if kind in _SOFTCAP:
        cap = getattr(text, "final_logit_softcapping", None)
        return LogitScaling(softcap=None if cap is None else float(cap))
    if kind in _COHERE:
        return LogitScaling(multiplier=float(getattr(lm, "logit_scale", text.logit_scale)))
    if kind in _DIVIDE_LOGITS_SCALING:
        return LogitScaling(multiplier=1.0 / float(text.logits_scaling))
    if kind in _MULTIPLY_LOGITS_SCALING:
        return LogitScaling(multiplier=float(text.logits_scaling))
    if kind in _FALCON_H1:
        return LogitScaling(multiplier=float(lm.model.lm_head_multiplier))
    return LogitScaling()


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
    time, each chunk recomputed in backward (module docstring). A plain bias-free
    ``nn.Linear`` head (every architecture in transformers' text models, tied or not) takes
    :class:`_LinearLogprobs`, which writes its gradient in place (about one ``chunk x V``
    fp32 buffer at a time); any other head (a LoRA-wrapped ``lm_head``, a bias) takes
    autograd under activation checkpointing per chunk (a few such buffers)."""
    hidden_BTH = final_hidden_states(model, input_ids_BT, mask_BT)
    return project_logprobs(
        model, hidden_BTH[trained_BT], targets_BT[trained_BT], temperature, chunk
    )


def project_logprobs(
    model: Any,
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    chunk: int,
) -> torch.Tensor:
    """Log-probs of ``targets_N`` from final hidden states ``hidden_NH``: ``model``'s head
    and logit scaling, ``chunk`` positions at a time (:func:`chunked_token_logprobs`; also
    called by :mod:`~searchr1.kit.learner.shared_prefix`); ``chunk`` 0 = all at once."""
    chunk = chunk if chunk > 0 else max(1, hidden_NH.shape[0])
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(lm).__name__} has no output embeddings (lm_head)")
    scaling = logit_scaling(model)
    if type(head) is torch.nn.Linear and head.bias is None:
        weight = head.weight
        from searchr1.kit.learner.fsdp import is_sharded

        if is_sharded(weight):
            # a head FSDP shards (fsdp.py keeps it whole): gathered for this projection, a
            # collective every rank runs in step; frozen, so no gradient flows to it
            if weight.requires_grad:
                raise ValueError("chunked log-probs: a trained lm_head cannot be sharded")
            weight = weight.full_tensor()
        return _LinearLogprobs.apply(hidden_NH, weight, targets_N, scaling, temperature, chunk)
    return _checkpointed_logprobs(head, hidden_NH, targets_N, scaling, temperature, chunk)


def _checkpointed_logprobs(
    head: Any,
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    scaling: LogitScaling,
    temperature: float,
    chunk: int,
) -> torch.Tensor:
    """Any ``head`` module: autograd per chunk, its logits recomputed in backward."""

    def piece(hidden_CH: torch.Tensor, targets_C: torch.Tensor) -> torch.Tensor:
        return target_logprobs(scaling.apply(head(hidden_CH)), targets_C, temperature)

    # Without autograd (a no-grad scoring pass) there is nothing to recompute.
    recompute = torch.is_grad_enabled()
    pieces = [hidden_NH.new_zeros((0,), dtype=torch.promote_types(hidden_NH.dtype, torch.float32))]
    for start in range(0, hidden_NH.shape[0], chunk):
        h_CH, t_C = hidden_NH[start : start + chunk], targets_N[start : start + chunk]
        if recompute:
            pieces.append(checkpoint(piece, h_CH, t_C, use_reentrant=False))
        else:
            pieces.append(piece(h_CH, t_C))
    return torch.cat(pieces)


def _scaled_logits(
    hidden_CH: torch.Tensor, weight_VH: torch.Tensor, scaling: LogitScaling, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``scaling(hidden @ weight.T) / temperature`` in fp32, ``C x V``, computed in place;
    with a soft-cap also ``tanh(.)`` (``C x V``), which its derivative needs."""
    logits_CV = at_least_fp32(hidden_CH @ weight_VH.T)  # a copy only in bf16/fp16
    if scaling.softcap is None:
        return logits_CV.mul_(scaling.multiplier / temperature), None
    tanh_CV = logits_CV.mul_(scaling.multiplier / scaling.softcap).tanh_()
    return tanh_CV * (scaling.softcap / temperature), tanh_CV


class _LinearLogprobs(torch.autograd.Function):
    """Log-probs of ``targets_N`` under ``scaling(hidden_NH @ weight_VH.T) / temperature``.

    Forward keeps only ``logsumexp`` per position; backward recomputes each chunk's logits
    and turns them into the gradient in the same buffer: d logprob / d x = onehot(target) -
    softmax(x), times ``multiplier / temperature`` (and ``1 - tanh^2`` under a soft-cap)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden_NH: torch.Tensor,
        weight_VH: torch.Tensor,
        targets_N: torch.Tensor,
        scaling: LogitScaling,
        temperature: float,
        chunk: int,
    ) -> torch.Tensor:
        n = hidden_NH.shape[0]
        dtype = torch.promote_types(hidden_NH.dtype, torch.float32)
        logprobs_N = torch.empty(n, dtype=dtype, device=hidden_NH.device)
        lse_N = torch.empty_like(logprobs_N)
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            x_CV, _ = _scaled_logits(hidden_NH[start:stop], weight_VH, scaling, temperature)
            target_C = x_CV.gather(-1, targets_N[start:stop, None]).squeeze(-1)
            # logsumexp in place (torch.logsumexp would allocate another C x V for exp).
            max_C1 = x_CV.amax(dim=-1, keepdim=True)
            lse_C = x_CV.sub_(max_C1).exp_().sum(dim=-1).log_().add_(max_C1.squeeze(-1))
            lse_N[start:stop] = lse_C
            logprobs_N[start:stop] = target_C - lse_C
            del x_CV
        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, lse_N)
        ctx.scaling, ctx.temperature, ctx.chunk = scaling, temperature, chunk
        return logprobs_N

    @staticmethod
    def backward(ctx: Any, grad_N: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        hidden_NH, weight_VH, targets_N, lse_N = ctx.saved_tensors
        scaling: LogitScaling = ctx.scaling
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h_NH = torch.zeros_like(hidden_NH) if want_h else None
        # In the weight's own dtype: an fp32 copy of a bf16 248k x 2560 head would be 2.5 GB.
        grad_w_VH = torch.zeros_like(weight_VH) if want_w else None
        factor = scaling.multiplier / ctx.temperature
        n = hidden_NH.shape[0]
        for start in range(0, n, ctx.chunk):
            stop = min(n, start + ctx.chunk)
            h_CH = hidden_NH[start:stop]
            x_CV, tanh_CV = _scaled_logits(h_CH, weight_VH, scaling, ctx.temperature)
            g_C = grad_N[start:stop].to(x_CV.dtype)
            # d(target - lse)/dx = onehot - softmax; times the upstream gradient.
            d_CV = x_CV.sub_(lse_N[start:stop, None]).exp_().mul_(-g_C[:, None])
            d_CV.scatter_add_(-1, targets_N[start:stop, None], g_C[:, None])
            if tanh_CV is not None:  # d(cap * tanh(m x / cap))/dx = m (1 - tanh^2)
                d_CV.mul_(tanh_CV.square_().neg_().add_(1.0))
                del tanh_CV
            d_CV = d_CV.mul_(factor).to(weight_VH.dtype)
            if grad_h_NH is not None:
                grad_h_NH[start:stop] = d_CV @ weight_VH
            if grad_w_VH is not None:
                grad_w_VH.addmm_(d_CV.T, h_CH)
            del x_CV, d_CV
        return grad_h_NH, grad_w_VH, None, None, None, None


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
        theirs_K = target_logprobs(logits_1KV[0], targets_T[positions_K], temperature)
    diff = float((ours_K - theirs_K).abs().max()) if len(positions_K) else 0.0
    dtype = logits_1KV.dtype
    tolerance = 1e-3 if dtype in (torch.float32, torch.float64) else 0.25
    return (math.isfinite(diff) and diff <= tolerance), diff
