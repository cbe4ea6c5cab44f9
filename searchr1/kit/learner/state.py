"""Checkpoints of the local provider: adapter (peft format), optimizer state and step.

Called by :meth:`Learner.save_state` / ``load_state`` (the train loop saves every
``train.save_every`` steps and loads on resume).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

FORMAT = 1

#: ``save_pretrained`` keywords for the adapter alone: the base vocabulary is never resized, so
#: the base's embeddings never need saving, and peft's "auto" would ask the hub for the base's
#: config at every save (retried for about 25 s when the hub is out of reach)
ADAPTER_ONLY = {"save_embedding_layers": False}


def save_state(
    path: str | Path,
    model: Any,
    optimizer: Any,
    step: int,
    sampler_gen: Any,
    *,
    adapter: Mapping[str, torch.Tensor] | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
) -> None:
    """Write the folder ``path``. ``adapter`` (parameter name -> whole tensor) and
    ``optimizer_state`` replace ``model``'s and ``optimizer``'s own state dicts (FSDP:
    those hold this rank's shards only, :mod:`.fsdp`)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    extra = {} if adapter is None else {"state_dict": dict(adapter)}
    model.save_pretrained(str(folder / "adapter"), **ADAPTER_ONLY, **extra)
    # File objects, not paths: torch then reports a full disk as the OSError it is
    # (a path gives a RuntimeError without an errno).
    with (folder / "optimizer.pt").open("wb") as fh:
        torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, fh)
    rng = {"torch": torch.get_rng_state()}
    if sampler_gen is not None:  # a sampler in this process (not a server's)
        rng["sampler"] = sampler_gen.get_state()
    with (folder / "rng.pt").open("wb") as fh:
        torch.save(rng, fh)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step, "format": FORMAT}))


def load_state(
    path: str | Path,
    model: Any,
    optimizer: Any,
    sampler_gen: Any,
    *,
    load_optimizer: Callable[[Mapping[str, Any]], None] | None = None,
) -> int:
    """Load a folder written by :func:`save_state` into ``model`` and ``optimizer``; returns
    the step. Errors name the missing or mismatching file. A sharded (FSDP) parameter keeps
    this rank's piece of the saved one; ``load_optimizer`` (given the saved state dict)
    replaces ``optimizer.load_state_dict`` (FSDP: each rank keeps its shard)."""
    from safetensors.torch import load_file

    folder = Path(path)
    adapter = folder / "adapter" / "adapter_model.safetensors"
    for needed in (adapter, folder / "optimizer.pt", folder / "trainer_state.json"):
        if not needed.is_file():
            raise FileNotFoundError(f"load_state({str(path)!r}): missing {needed}")
    state = json.loads((folder / "trainer_state.json").read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{folder / 'trainer_state.json'}: unknown format {state.get('format')}")
    device = str(next(model.parameters()).device)
    weights = _read(adapter, lambda: load_file(str(adapter), device=device))
    _load_adapter(model, weights, adapter)
    optimizer_file = folder / "optimizer.pt"
    saved = _read(optimizer_file, lambda: torch.load(optimizer_file, weights_only=True))
    (load_optimizer or optimizer.load_state_dict)(saved)
    rng_file = folder / "rng.pt"
    if rng_file.is_file():
        rng = _read(rng_file, lambda: torch.load(rng_file, weights_only=True))
        torch.set_rng_state(rng["torch"])
        if sampler_gen is not None and "sampler" in rng:
            sampler_gen.set_state(rng["sampler"])
    return int(state["step"])


def _read(path: Path, load: Callable[[], Any]) -> Any:
    """``load()``, a file that does not read as what it should be raised as a ValueError
    naming ``path`` (safetensors and torch raise their own types for a damaged file)."""
    from safetensors import SafetensorError

    try:
        return load()
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path} is damaged ({type(exc).__name__}: {exc})") from None


def _load_adapter(model: Any, weights: Mapping[str, torch.Tensor], adapter: Path) -> None:
    """``weights`` (peft's saved adapter: the trainable parameters, named without the
    adapter's name ``default``) into ``model``; a sharded parameter (FSDP) takes this rank's
    piece. Errors name the ``adapter`` file."""
    from searchr1.kit.learner.fsdp import is_sharded, shard_of

    params = {
        name.replace(".default", ""): p for name, p in model.named_parameters() if p.requires_grad
    }
    unexpected = sorted(set(weights) - set(params))
    if unexpected:
        raise ValueError(
            f"{adapter}: adapter does not match this model's LoRA config (unexpected keys "
            f"{unexpected[:3]}); check [lora] rank and target_modules"
        )
    missing = sorted(set(params) - set(weights))
    if missing:
        raise ValueError(
            f"{adapter}: adapter lacks weights this model's LoRA config needs ({missing[:3]}); "
            f"check [lora] target_modules"
        )
    for key, p in params.items():
        if weights[key].shape != p.shape:  # saved with another rank or model
            raise ValueError(
                f"{adapter}: adapter does not fit this model's LoRA config (check [lora] rank and "
                f"the base model): {key} has shape {tuple(weights[key].shape)}, the model's "
                f"{tuple(p.shape)}"
            )
        with torch.no_grad():
            if is_sharded(p):
                p.to_local().copy_(shard_of(weights[key], p))
            else:
                p.copy_(weights[key])
