"""The warning for Gated DeltaNet models without their fast CUDA kernels names the pip
packages, only on CUDA and only for models with linear-attention layers (tiny real configs;
this environment has neither flash-linear-attention nor causal-conv1d)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from arch_models import family_config
from structlog.testing import capture_logs

from searchr1.kit.learner.kernels import missing_kernels, warn_if_slow_kernels


@pytest.mark.skipif(
    importlib.util.find_spec("fla") is not None, reason="flash-linear-attention is installed"
)
def test_missing_kernels_are_named_on_cuda_for_gated_deltanet_only() -> None:
    qwen3_5, qwen3 = family_config("qwen3_5", 64, 0), family_config("qwen3", 64, 0)
    assert "flash-linear-attention" in missing_kernels(qwen3_5)
    assert missing_kernels(qwen3) == []
    with capture_logs() as logs:
        assert warn_if_slow_kernels(qwen3_5, torch.device("cpu")) == []
        assert warn_if_slow_kernels(qwen3, torch.device("cuda")) == []
    assert logs == []
    with capture_logs() as logs:
        missing = warn_if_slow_kernels(qwen3_5, torch.device("cuda"))
    assert "flash-linear-attention" in missing
    (event,) = logs
    assert event["event"] == "gated_deltanet_slow_kernels" and event["log_level"] == "warning"
    assert "pip install" in event["message"] and "flash-linear-attention" in event["message"]
