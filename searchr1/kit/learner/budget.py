"""The sampler's token budget: how many cache positions may be held at once."""

from __future__ import annotations

from typing import Any

import torch

_FALLBACK_TOKENS = 1 << 20


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of keys + values one position costs across the model's attention layers."""
    text = config.get_text_config()
    layers = int(getattr(text, "num_hidden_layers", 1) or 1)
    types = getattr(text, "layer_types", None)
    if types:
        layers = sum(1 for t in types if "linear" not in str(t) and "mamba" not in str(t))
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None) or int(getattr(text, "hidden_size", heads)) // heads
    size = torch.empty((), dtype=dtype).element_size()
    return max(1, 2 * layers * kv_heads * int(head_dim) * size)


def state_bytes_per_row(config: Any, dtype: torch.dtype) -> int:
    """Bytes of conv + recurrent state one row holds across the linear-attention layers
    (Gated DeltaNet, as in Qwen3.5 and Qwen3-Next); 0 for a model without them. The
    recurrent state is counted in float32, as the reference kernels keep it."""
    text = config.get_text_config()
    types = getattr(text, "layer_types", None) or []
    layers = sum(1 for t in types if "linear" in str(t))
    v_heads = getattr(text, "linear_num_value_heads", None)
    if not layers or not v_heads:
        return 0
    k_heads = int(getattr(text, "linear_num_key_heads", v_heads))
    k_dim = int(getattr(text, "linear_key_head_dim", 128))
    v_dim = int(getattr(text, "linear_value_head_dim", 128))
    kernel = int(getattr(text, "linear_conv_kernel_dim", 4))
    size = torch.empty((), dtype=dtype).element_size()
    conv = (2 * k_heads * k_dim + int(v_heads) * v_dim) * kernel * size
    recurrent = int(v_heads) * k_dim * v_dim * 4
    return layers * (conv + recurrent)


def row_overhead_tokens(config: Any, dtype: torch.dtype) -> int:
    """:func:`state_bytes_per_row` in units of :func:`kv_bytes_per_token` (rounded up)."""
    state = state_bytes_per_row(config, dtype)
    per_token = kv_bytes_per_token(config, dtype)
    return -(-state // per_token)


def token_budget(setting: int, config: Any, dtype: torch.dtype, device: torch.device) -> int:
    """``setting`` when > 0, else derived from memory (see the module docstring)."""
    if setting > 0:
        return setting
    per_token = kv_bytes_per_token(config, dtype)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1024, int(free * 0.5) // per_token)
    ram = _total_ram()
    if ram is None:
        return _FALLBACK_TOKENS
    return max(1024, ram // 4 // per_token)


def budget_source(setting: int, device: torch.device) -> str:
    """Where :func:`token_budget` took the budget from, and whether a rerun gets the same."""
    if setting > 0:
        return "[model.local] max_batch_tokens"
    if device.type == "cuda":
        return (
            "half the GPU memory free after the load: it varies with what else uses the GPU, "
            "and with it which requests may share a batch; set [model.local] max_batch_tokens "
            "to this value to repeat a run exactly"
        )
    if _total_ram() is None:
        return "a fixed default (this machine's RAM is unknown)"
    return "a quarter of this machine's RAM (its total: the same on every run here)"


def _total_ram() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
