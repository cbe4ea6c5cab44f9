"""Device, dtype and CPU-thread choices of the local model provider.

Called once by :meth:`LocalModelProvider.from_config` before the model is loaded.
``[model] device = "auto"`` picks CUDA when present, then Apple MPS, then the CPU;
``dtype = "auto"`` is bfloat16 on CUDA (what the model was trained in, half the memory) and
float32 elsewhere (CPUs are slow at bf16 and the exactness tests need fp32).
"""

from __future__ import annotations

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
    """Use every core this process may run on (``threads`` > 0 overrides); returns the count.

    torch's default counts physical cores of the whole machine, which oversubscribes a
    container limited to a few cores and makes every matmul slower."""
    import torch

    if threads <= 0:
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS
            threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads
