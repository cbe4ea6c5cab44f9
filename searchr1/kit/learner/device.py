"""Device, dtype and CPU-thread choices of the local model provider.

Called once by :meth:`LocalModelProvider.from_config` before the model is loaded.
``[model] device = "auto"`` picks CUDA when present, then Apple MPS, then the CPU;
``dtype = "auto"`` is bfloat16 on CUDA (what the model was trained in, half the memory) and
float32 elsewhere (CPUs are slow at bf16 and the exactness tests need fp32).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from searchr1.sdk import ConfigValueError

if TYPE_CHECKING:
    import torch

#: torch's names; float64 for exactness checks (two computations of the same maths agree to
#: ~1e-12 on any CPU)
_DTYPES = ("float32", "bfloat16", "float16", "float64")


def choose_device(spec: str) -> torch.device:
    """``[model] device`` -> a torch device; errors name the field."""
    import torch

    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigValueError(f"model.device = {spec!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigValueError(f"model.device = {spec!r} but CUDA is not available on this machine")
    return device


def choose_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``[model] dtype`` -> a torch dtype (``auto``: bf16 on CUDA, fp32 elsewhere)."""
    import torch

    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if spec not in _DTYPES:
        raise ConfigValueError(f"model.dtype = {spec!r} is not one of auto, {', '.join(_DTYPES)}")
    return getattr(torch, spec)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; all cores on macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        return os.cpu_count() or 1


def configure_cpu_threads(threads: int = 0) -> int:
    """Set torch's intra-op threads; returns the count. ``threads`` > 0 is used as given.

    Auto (0): :func:`available_cores`, a fixed number for a given machine and affinity mask,
    so a run's numerics (the reduction order of every op) do not depend on what else happens
    to be running when it starts. On an oversubscribed machine (more busy threads than cores,
    e.g. a box shared with other jobs) set ``[model.local] threads = 1``: OpenMP threads wait
    for each other at every op, so one descheduled thread stalls all of them
    (docs/benchmarks.md measures it)."""
    import torch

    if threads <= 0:
        threads = available_cores()
    torch.set_num_threads(threads)
    return threads


def repeatable_cpu_kernels() -> None:
    """Have torch take its ordered CPU kernels where it has both kinds.

    A few of torch's parallel CPU kernels (met in the learner's backward) add up their parts
    in the order the threads finish: the same step on the same weights and data then gives
    gradients apart in the last bits, and two runs of one seed drift apart. Deterministic
    mode takes the ordered kernels; uninitialized memory is left unfilled (the mode would fill
    every ``torch.empty`` with NaN, a cost that buys nothing here)."""
    import torch
    import torch.utils.deterministic

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
