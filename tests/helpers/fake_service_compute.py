"""What the loopback fakes of remote training services compute with: the ``local`` provider.

Shared by ``tests/helpers/fake_pytrio_service.py`` and ``tests/helpers/fake_tinker_service.py``; each fake
speaks its SDK's wire protocol and calls these functions for the numbers. A training run is a
:class:`LocalModelProvider` (fp32, CPU, LoRA dropout 0, ``alpha = 2 * rank``, learner
temperature 1 -- a service computes untempered log-probs); a sampler is another one loaded
from a saved checkpoint. Losses are the built-in ``searchr1.plugins.losses`` (Tinker
semantics: a sum over positions), chosen by name with Tinker's ``loss_fn_config`` (ratio
thresholds ``clip_low_threshold`` / ``clip_high_threshold``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from trainer_calls import forward_backward

_ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
_MLP = ["gate_proj", "up_proj", "down_proj"]


class ModelNotFound(LookupError):
    """The service does not know the base model."""


def resolve_model(name: str) -> str:
    """The local folder of ``name`` (a ``builtin:`` model or a path)."""
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    if not name:
        raise ModelNotFound("base_model is required")
    try:
        return resolve(name, load_registry().assets)  # the service's own installed models
    except FileNotFoundError as exc:
        raise ModelNotFound(str(exc)) from None


def new_provider(
    model_path: str,
    *,
    rank: int,
    seed: int | None,
    train_attn: bool = True,
    train_mlp: bool = True,
    train_unembed: bool = False,
) -> Any:
    """A local provider with the run's LoRA, fp32 on the CPU, temperature 1."""
    from searchr1.core.config_schema import Config
    from searchr1.plugins.local_model.provider import LocalModelProvider

    targets = (_ATTN if train_attn else []) + (_MLP if train_mlp else [])
    targets += ["lm_head"] if train_unembed else []
    config = Config().replace(
        model={"base_model": model_path, "device": "cpu", "dtype": "float32", "temperature": 1.0},
        lora={
            "rank": rank,
            "alpha": 2.0 * rank,
            "dropout": 0.0,
            "target_modules": tuple(targets),
        },
        run={"seed": seed or 0},
    )
    config = dataclasses.replace(config, plugins={"model.local": {"batch_wait_ms": 0.0}})
    return LocalModelProvider.from_config(config)


def loss_by_name(name: str, config: Mapping[str, Any] | None) -> Any:
    """The built-in loss ``name`` with a Tinker ``loss_fn_config`` applied."""
    from searchr1.plugins import losses

    fns = {
        "importance_sampling": losses.importance_sampling,
        "ppo": losses.ppo,
        "cispo": losses.cispo,
    }
    if name not in fns:
        raise ValueError(f"loss {name!r} is not supported by the fake trainer")
    settings: dict[str, float] = {}
    if name != "importance_sampling" and config:
        settings = {
            "clip_low": 1.0 - float(config.get("clip_low_threshold", 0.8)),
            "clip_high": float(config.get("clip_high_threshold", 1.2)) - 1.0,
        }
    return losses.NamedLoss(name, fns[name], settings)


def forward(
    provider: Any, datums: Sequence[Any], loss_fn: Any, *, backward: bool
) -> tuple[list[np.ndarray], float, int]:
    """Per-datum learner log-probs of the current weights (float32), the summed loss and the
    number of trained positions; with ``backward`` the gradients accumulate in ``provider``."""
    import torch

    from searchr1.core.types import LossInputs
    from searchr1.kit.learner.learner import token_logprobs

    logprobs = []
    for d in datums:
        with torch.no_grad():
            ids = torch.tensor([d.input_tokens])
            lp = token_logprobs(
                provider.model, ids, torch.ones_like(ids), torch.tensor([d.target_tokens]), 1.0
            )[0]
        logprobs.append(lp.numpy().astype(np.float32))
    if backward:
        loss = forward_backward(provider, list(datums), loss_fn, 1.0).loss
    else:
        loss = 0.0
        for d, lp in zip(datums, logprobs, strict=True):
            inputs = LossInputs(torch.tensor(d.sampler_logprobs), torch.tensor(d.advantages))
            loss += float(loss_fn(torch.from_numpy(lp.copy()), inputs).loss)
    tokens = sum(1 for d in datums for a in d.advantages if a != 0.0)
    return logprobs, float(loss), tokens


def adam(params: Any) -> Any:
    """An SDK's ``AdamParams`` as searchr1's."""
    from searchr1.core.types import AdamParams

    return AdamParams(
        params.learning_rate,
        params.beta1,
        params.beta2,
        params.eps,
        params.weight_decay,
        params.grad_clip_norm or None,
    )
