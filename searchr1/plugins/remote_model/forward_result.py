"""A remote ``forward_backward``'s answer as the :class:`ForwardBackwardResult` the local
provider reports.

Called by :class:`~searchr1.plugins.remote_model.pending.PendingResult` when the result of a
submitted ``forward_backward`` is first needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from searchr1.core.step_metrics import mismatch_from_logprobs
from searchr1.core.types import Datum, ForwardBackwardResult


def forward_result(
    output: Any, datums: Sequence[Datum], loss_scale: float
) -> ForwardBackwardResult:
    """The service's loss (unscaled back, as the local provider reports it) plus the metrics
    the local provider reports, recomputed from the per-token log-probs the service returns:
    sums (``tokens``, ``ratio_sum``), ``ratio_max``, ``ratio_mean``, ``logprob_diff_max``
    (largest |learner - sampler| log-prob on trained positions) and the ``mismatch/*``
    metrics (:func:`searchr1.core.step_metrics.mismatch_from_logprobs`)."""
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
            ratio_mean=ratio_sum / tokens,
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
