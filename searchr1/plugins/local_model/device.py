"""Device, dtype and CPU-thread choices of the local model provider.

Called once by :meth:`LocalModelProvider.from_config` before the model is loaded.
``[model] device = "auto"`` picks CUDA when present, then Apple MPS, then the CPU;
``dtype = "auto"`` is bfloat16 on CUDA (what the model was trained in, half the memory) and
float32 elsewhere (CPUs are slow at bf16 and the exactness tests need fp32).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


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
        raise ValueError(f"model.device = {spec!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device = {spec!r} but CUDA is not available on this machine")
    return device


def choose_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``[model] dtype`` -> a torch dtype (``auto``: bf16 on CUDA, fp32 elsewhere)."""
    import torch

    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if spec not in _DTYPES:
        raise ValueError(f"model.dtype = {spec!r} is not one of auto, {', '.join(_DTYPES)}")
    return getattr(torch, _DTYPES[spec])


def configure_cpu_threads(threads: int = 0) -> int:
    """Set torch's intra-op threads; returns the count. ``threads`` > 0 is used as given.

    Auto (0): the cores this process may run on, less the load other processes put on them
    (1-minute load average, this process counted as free). torch's own default counts the
    machine's cores, which is a disaster on a shared box: OpenMP threads wait for each other
    at every op, so when the cores are busy one descheduled thread stalls all of them. On the
    2-core development machine under a load of 10, a decoding step took 12x longer with 2
    threads than with 1."""
    import torch

    if threads <= 0:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS
            cores = os.cpu_count() or 1
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
        threads = max(1, min(cores, math.floor(cores - load + 1)))
    torch.set_num_threads(threads)
    return threads
