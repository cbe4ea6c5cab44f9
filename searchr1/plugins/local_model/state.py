"""Checkpoints of the local provider: adapter (peft format), optimizer state and step.

Called by :meth:`Learner.save_state` / ``load_state`` (the train loop saves every
``train.save_every`` steps and loads on resume). Layout of the folder ``path``::

    adapter/              adapter_config.json + adapter_model.safetensors
                          (``PeftModel.from_pretrained(base, path + "/adapter")`` loads it)
    optimizer.pt          AdamW state_dict
    trainer_state.json    {"step": N, "format": 1}
    rng.pt                torch CPU RNG and the in-process sampler's stream, so dropout and unseeded
                          sampling continue as they would have

Resuming gives bit-identical next-step losses on the CPU: the adapter is stored in float32
safetensors and the optimizer's moments are restored exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


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
    model.save_pretrained(str(folder / "adapter"), **extra)
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
    load_adapter: Callable[[Mapping[str, torch.Tensor]], None] | None = None,
    load_optimizer: Callable[[Mapping[str, Any]], None] | None = None,
) -> int:
    """Load a folder written by :func:`save_state` into ``model`` and ``optimizer``; returns
    the step. Errors name the missing or mismatching file. ``load_adapter`` (given the saved
    adapter tensors by saved name) and ``load_optimizer`` (given the saved state dict)
    replace the loading into ``model`` and ``optimizer`` (FSDP: each rank keeps its shard)."""
    from safetensors.torch import load_file

    folder = Path(path)
    adapter = folder / "adapter" / "adapter_model.safetensors"
    for needed in (adapter, folder / "optimizer.pt", folder / "trainer_state.json"):
        if not needed.is_file():
            raise FileNotFoundError(f"load_state({str(path)!r}): missing {needed}")
    state = json.loads((folder / "trainer_state.json").read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{folder / 'trainer_state.json'}: unknown format {state.get('format')}")
    weights = load_file(str(adapter), device=str(next(model.parameters()).device))
    if load_adapter is None:
        _load_adapter(model, weights, adapter)
    else:
        try:
            load_adapter(weights)
        except ValueError as exc:
            raise ValueError(f"{adapter}: {exc}") from exc
    saved = torch.load(folder / "optimizer.pt", weights_only=True)
    (load_optimizer or optimizer.load_state_dict)(saved)
    rng_file = folder / "rng.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["torch"])
        if sampler_gen is not None and "sampler" in rng:
            sampler_gen.set_state(rng["sampler"])
    return int(state["step"])


def _load_adapter(model: Any, weights: Mapping[str, torch.Tensor], adapter: Path) -> None:
    """``weights`` (peft's saved adapter) into ``model``; errors name the ``adapter`` file."""
    from peft import set_peft_model_state_dict

    try:
        result = set_peft_model_state_dict(model, weights)
    except RuntimeError as exc:  # shape mismatch: saved with another rank or model
        raise ValueError(
            f"{adapter}: adapter does not fit this model's LoRA config (check [lora] rank and "
            f"the base model): {str(exc).splitlines()[0]}"
        ) from exc
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(
            f"{adapter}: adapter does not match this model's LoRA config (unexpected keys "
            f"{unexpected[:3]}); check [lora] rank and target_modules"
        )
    missing = [k for k in getattr(result, "missing_keys", None) or [] if "lora_" in k]
    if missing:
        raise ValueError(
            f"{adapter}: adapter lacks weights this model's LoRA config needs ({missing[:3]}); "
            f"check [lora] target_modules"
        )
