"""Comparing two computations of the same mathematics, on any CPU and thread count.

Two code paths that compute the same thing (chunked vs whole, shared prefixes vs not, the
sampler's incremental forward vs the learner's full one) differ only in the order of their
floating-point sums. For a sum of n terms, any two orders differ by at most
``gamma_n * sum|x_i|`` with ``gamma_n = n*u / (1 - n*u)`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., section 4.2), ``u`` the dtype's unit roundoff. A test model's
layers chain a few dozen such sums of at most a few thousand O(1) terms, and a recurrence
(Gated DeltaNet) can amplify the difference by its state's growth: in float32
(``u = 6e-8``) that bound is near the differences a correct path shows (1e-6 to 1e-5 of a
gradient's scale, and it moves with each CPU's kernels), so the equality checks run in
float64 (``u = 1.1e-16``), where the same bound is below 1e-11 of scale.

``RTOL64 = 1e-9`` leaves a margin of 100x over that and stays eight orders of magnitude
below the error of a wrong path (a dropped temperature, a column mix-up or a detached
``logsumexp`` is off by O(1) of scale).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch

from searchr1.core.types import Datum

RTOL64 = 1e-9

# transformers keeps parts of attention in float32 even for a float64 model (the eager
# softmax is taken in float32; SDPA's CPU backward too). Two paths whose attention differs in
# shape (a prefix run once from a cache vs the whole row) then differ by float32 roundings:
# one per attention probability (u32 = 6e-8), summed over at most 32 keys, through at most 4
# layers: 4 * 32 * 6e-8 = 7.7e-6 of a gradient's scale. Seen: 7e-8.
RTOL64_F32_ATTENTION = 1e-5

# Sampler vs learner log-probs of a float32 model (as users run on CPU, and the runs
# through the CLI), or of a family whose transformers kernels compute in float32 whatever the
# model's dtype (Gated DeltaNet keeps its recurrent state in float32; the mixture-of-experts
# grouped matmul takes no float64). The sampler's step-by-step forward and the learner's whole
# or chunked one then differ by float32 reduction order: at most one rounding (u32 = 6e-8)
# per position feeding a state or an attention row, over at most 512 positions, in at most
# 4 layers, on log-probs of tempered logits at most 8 in magnitude: 4 * 512 * 6e-8 * 8 = 1e-3.
# Seen: 1e-6 to 4e-5. A stale adapter, a wrong token or temperature is off by 1e-2 or more.
FLOAT32_KERNEL_FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_moe")
LOGPROB_TOL_F32 = 1e-3


def assert_same64(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """``got`` equals ``want`` (two float64 computations of the same maths) to
    ``RTOL64`` of ``want``'s largest magnitude (1 where that is below 1)."""
    assert got.dtype == want.dtype == torch.float64, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    error = float((got - want).abs().max()) if want.numel() else 0.0
    assert error <= RTOL64 * scale, (what, error, scale)


def assert_same_grads64(
    got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], rtol: float = RTOL64
) -> None:
    """The same parameters got gradients, some non-zero, each equal to ``want``'s to
    ``rtol`` of that gradient's own largest magnitude."""
    assert want and got.keys() == want.keys()
    assert any(float(g.abs().sum()) > 0 for g in want.values())
    for name, g in want.items():
        scale = float(g.abs().max())
        error = float((got[name] - g).abs().max())
        assert error <= rtol * scale + 1e-300, (name, error, scale)


def random_datums(vocab: int, n: int = 5, seed: int = 0) -> list[Datum]:
    """``n`` datums of random tokens and lengths: a prompt (advantage 0), then 'generated'
    tokens with sampler log-probs in [-7, -5] and one advantage each (-1, 0.5 or 1)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, gen = rng.randint(3, 10), rng.randint(4, 20)
        seq = [rng.randrange(3, vocab) for _ in range(prompt + gen)]
        adv = rng.choice([-1.0, 0.5, 1.0])
        out.append(
            Datum(
                tuple(seq[:-1]),
                tuple(seq[1:]),
                tuple([0.0] * (prompt - 1) + [rng.uniform(-7, -5) for _ in range(gen)]),
                tuple([0.0] * (prompt - 1) + [adv] * gen),
                trajectory_id=f"traj-{seed}-{i}",
            )
        )
    return out
