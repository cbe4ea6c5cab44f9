"""Which layers a LoRA adapter reaches, by layer type.

A hybrid model has layers of several kinds: Qwen3.5 puts Gated DeltaNet linear attention
(``linear_attn.in_proj_qkv``, ``in_proj_z``, ``in_proj_a``, ``in_proj_b``, ``out_proj``) in
three of every four layers and full attention (``self_attn.q_proj`` ...) in the fourth. The
reference setup's ``target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]`` then adapts 8 of
Qwen3.5-4B's 32 layers and nothing else, silently. This module says so.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1.sdk import Config

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class Layer:
    """One decoder layer: its type (``config.layer_types`` or ``"decoder"``) and the names
    of its linear modules relative to the layer (``self_attn.q_proj``)."""

    index: int
    kind: str
    linear: tuple[str, ...]


def decoder_layers(model: Any) -> list[Layer]:
    """The decoder layers of a transformers causal LM (real or on the meta device): the
    longest ``ModuleList`` of the model, typed by its text config's ``layer_types``."""
    import torch

    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    _, layers = max(lists, key=lambda item: len(item[1]))
    text = model.config.get_text_config()
    types = list(getattr(text, "layer_types", None) or [])
    out = []
    for i, layer in enumerate(layers):
        # read before peft wraps the model: every Linear is one of the model's own
        linear = tuple(
            name for name, module in layer.named_modules() if isinstance(module, torch.nn.Linear)
        )
        kind = str(types[i]) if i < len(types) else "decoder"
        out.append(Layer(i, kind, linear))
    return out


def _matches(name: str, targets: Sequence[str]) -> bool:
    """peft's rule for a list of names: the module's full name or its last dotted parts."""
    if list(targets) == [ALL_LINEAR]:
        return True
    return any(name == t or name.endswith(f".{t}") for t in targets)


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _adapted(layers: Iterable[Layer], targets: Sequence[str]) -> dict[str, list[tuple[Layer, set[str]]]]:  # fmt: skip
    by_kind: dict[str, list[tuple[Layer, set[str]]]] = {}
    for layer in layers:
        hit = {n for n in layer.linear if _matches(n, targets)}
        by_kind.setdefault(layer.kind, []).append((layer, hit))
    return by_kind


def _describe(kind: str, rows: list[tuple[Layer, set[str]]]) -> str:
    """``full_attention: 8 of 8 layers (q_proj, k_proj, v_proj, o_proj)`` or
    ``linear_attention: none of its 24 layers``."""
    covered = [hit for _, hit in rows if hit]
    names = list(dict.fromkeys(_leaf(n) for layer, hit in rows for n in layer.linear if n in hit))
    if not names:
        return f"{kind}: none of its {len(rows)} layers"
    return f"{kind}: {len(covered)} of {len(rows)} layers ({', '.join(names)})"


def coverage_line(layers: Sequence[Layer], adapted: dict[int, set[str]]) -> str:
    """``LoRA adapter over 32 layers: linear_attention: none of its 24 layers;
    full_attention: 8 of 8 layers (q_proj, k_proj, v_proj, o_proj)`` from the layers and, per
    layer index, the names of its modules that hold LoRA weights."""
    by_kind: dict[str, list[tuple[Layer, set[str]]]] = {}
    for layer in layers:
        by_kind.setdefault(layer.kind, []).append((layer, adapted.get(layer.index, set())))
    parts = "; ".join(_describe(kind, rows) for kind, rows in by_kind.items())
    return f"LoRA adapter over {len(layers)} layers: {parts}"


def peft_adapted(model: Any, layers: Sequence[Layer]) -> dict[int, set[str]]:
    """Per layer index, its module names (relative to the layer) that peft gave LoRA
    weights, read off a wrapped model."""
    import torch

    lists = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists or not layers:
        return {}
    modules = max(lists, key=len)
    out: dict[int, set[str]] = {}
    for i, layer in enumerate(modules):
        names = {
            name.removesuffix(".base_layer")
            for name, module in layer.named_modules()
            if hasattr(module, "lora_A") and not name.endswith(".base_layer")
        }
        out[i] = names
    return out


def missing_layer_types(
    layers: Sequence[Layer], targets: Sequence[str], model_name: str
) -> list[str]:
    """A warning per layer type none of whose modules ``targets`` names, while another type
    is adapted (a model whose targets match nothing at all is refused at load instead)."""
    if list(targets) == [ALL_LINEAR] or not layers:
        return []
    by_kind = _adapted(layers, targets)
    if len(by_kind) < 2 or not any(hit for rows in by_kind.values() for _, hit in rows):
        return []
    out = []
    for kind, rows in by_kind.items():
        if any(hit for _, hit in rows):
            continue
        others = {
            n for k, r in by_kind.items() if k != kind for layer, _ in r for n in layer.linear
        }
        names = dict.fromkeys(n for layer, _ in rows for n in layer.linear)
        own = [n for n in names if n not in others] or list(names)
        covered = "; ".join(_describe(k, r) for k, r in by_kind.items() if any(h for _, h in r))
        out.append(
            f"lora.target_modules = {list(targets)} adapts no module of the {kind} layers of "
            f"{model_name!r} ({len(rows)} of its {len(layers)} layers, whose own linear "
            f"modules are {', '.join(own)}); only {covered} learn. Set "
            f'target_modules = "{ALL_LINEAR}" to adapt every linear layer, or add '
            f"{', '.join(repr(_leaf(n)) for n in own)} to the list"
        )
    return out


def meta_model(model: str | Path) -> Any | None:
    """``model`` (a folder, or a hub id already in the local cache) built from its
    ``config.json`` on the meta device: no weights are read, nothing is downloaded, no memory
    is taken. None when its config is not on this machine or transformers cannot build the
    architecture. Kept per folder and ``config.json`` version: ``config check`` and a run's
    start ask more than once."""
    config_file = Path(model).expanduser() / "config.json"
    version = config_file.stat().st_mtime_ns if config_file.is_file() else 0
    return _meta_model(str(model), version)


@functools.lru_cache(maxsize=4)
def _meta_model(model: str, _version: int) -> Any | None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model, local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception:  # an architecture this transformers does not know: the load says so
        return None


def meta_layers(model: str | Path) -> list[Layer] | None:
    """The decoder layers of ``model`` from :func:`meta_model`; None when it cannot be built."""
    built = meta_model(model)
    return None if built is None else decoder_layers(built)


def unknown_targets(model: Any, targets: Sequence[str], model_name: str) -> str | None:
    """What is wrong with ``[lora] target_modules`` for ``model`` (loaded, or on the meta
    device: the same module names): the names peft would find no module for, the model's
    projections and the ``"all-linear"`` fix; None when every name is there."""
    if list(targets) == [ALL_LINEAR]:
        return None
    leaves = {_leaf(name) for name, _ in model.named_modules()}
    missing = [t for t in targets if _leaf(t) not in leaves]
    if not missing:
        return None
    return (
        f"lora.target_modules: {missing} not found in {model_name!r}; linear layers there "
        f"include: {sorted(n for n in leaves if n.endswith('_proj'))}; or set "
        f'target_modules = "{ALL_LINEAR}" (every linear layer but the output head)'
    )


#: a ``base_model`` written as a path on this machine rather than a hub id
_PATH_PREFIXES = ("/", "./", "../", "~")


def check_model(config: Config) -> list[str]:
    """The ``check`` of the providers that load ``[model] base_model`` into this process
    (``local``, ``vllm``'s learner), before any weight is read: a ``builtin:`` asset, a
    ``.gguf`` file or a folder that is not there, and ``[lora] target_modules`` naming a
    module the model lacks (read off :func:`meta_model` when its ``config.json`` is here; a
    hub id not yet downloaded is checked by the load)."""
    from searchr1.kit.gguf import model_path
    from searchr1.sdk import ConfigValueError

    name = config.model.base_model
    where = config.where("model.base_model")
    if name.startswith(_PATH_PREFIXES) and not Path(name).expanduser().exists():
        return [
            f"{where}: model.base_model = {name!r}: no such file or folder "
            f"({Path(name).expanduser().absolute()}); give a model folder, a .gguf file, a "
            f"hub id or a builtin: model"
        ]
    try:
        path = model_path(name, config.assets)
    except FileNotFoundError as exc:  # an unknown builtin: asset, a .gguf file not there
        return [f"{where}: model.base_model = {name!r}: {exc}"]
    except ConfigValueError as exc:  # a builtin: model whose source is not installed
        return [f"{where}: {exc}"]
    except Exception:  # noqa: BLE001 - a conversion that fails is the load's error to report
        return []
    model = meta_model(path)
    problem = None if model is None else unknown_targets(model, config.lora.target_modules, name)
    return [f"{config.where('lora.target_modules')}: {problem}"] if problem else []


def coverage_warnings(config: Config) -> list[str]:
    """The warnings of :func:`missing_layer_types` for ``[model] base_model`` when its
    ``config.json`` is on this machine (a ``builtin:`` asset, a folder, a cached hub id);
    none otherwise (the load logs the coverage, ``lora_coverage``, once it is here). Called
    before the run, by ``config check``, ``smoke`` and ``train``."""
    from searchr1.kit.gguf import model_path

    name = config.model.base_model
    try:
        layers = meta_layers(model_path(name, config.assets))
    except Exception:  # a builtin: asset that cannot be built is the load's error to report
        return []
    return missing_layer_types(layers or [], config.lora.target_modules, name)


def lora_advice(config: Config) -> list[str]:
    """What the in-process learner says about ``[lora]`` before a run (the factory's
    ``advise``; ``config check``, ``smoke`` and ``train`` print each line): dropout, which the
    learner turns off, and layer types of the model that ``target_modules`` leaves without
    any adapted module."""
    out = []
    if config.lora.dropout > 0:
        out.append(
            f"lora.dropout = {config.lora.dropout:g} has no effect on provider "
            f"{config.model.provider!r}: the learner scores the policy with dropout off, as the "
            f"sampler runs it, so on-policy importance ratios are 1 (a dropout-thinned learner "
            f"put them up to 1.10 at 0.05)"
        )
    return out + coverage_warnings(config)
