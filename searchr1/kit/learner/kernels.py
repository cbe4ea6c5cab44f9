"""Whether a Gated DeltaNet model (Qwen3.5, Qwen3-Next) would run on its fast CUDA kernels."""

from __future__ import annotations

import importlib.util
from typing import Any

#: pip distribution -> the module transformers imports.
KERNEL_PACKAGES = {"flash-linear-attention": "fla", "causal-conv1d": "causal_conv1d"}


def has_gated_deltanet(config: Any) -> bool:
    """Whether ``config`` (a transformers config, composite or text) has linear-attention
    (Gated DeltaNet) layers."""
    text = config.get_text_config()
    return "linear_attention" in (getattr(text, "layer_types", None) or ())


def missing_kernels(config: Any) -> list[str]:
    """The pip packages of :data:`KERNEL_PACKAGES` that are not importable, if ``config``
    has Gated DeltaNet layers (else ``[]``)."""
    if not has_gated_deltanet(config):
        return []
    return [
        pip for pip, module in KERNEL_PACKAGES.items() if importlib.util.find_spec(module) is None
    ]


def warn_if_slow_kernels(config: Any, device: Any) -> list[str]:
    """On CUDA, log ``gated_deltanet_slow_kernels`` naming the missing packages; returns them."""
    if getattr(device, "type", str(device)) != "cuda":
        return []
    missing = missing_kernels(config)
    if missing:
        from searchr1.sdk import get_logger

        get_logger().warning(
            "gated_deltanet_slow_kernels",
            model_type=getattr(config, "model_type", "?"),
            missing=missing,
            message=f"this model's Gated DeltaNet layers will run transformers' reference "
            f"PyTorch code on the GPU (much slower, more memory): `pip install "
            f"{' '.join(missing)}` (or `pip install --no-build-isolation 'searchr1[gpu]'`; "
            f"causal-conv1d compiles against the installed CUDA torch)",
        )
    return missing
