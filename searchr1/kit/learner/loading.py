"""Loading a model for the local learner: ``[model.local]`` (:class:`LocalSettings`), the base
model with its LoRA adapter (:func:`load_lora_model`), and its learner (:func:`make_learner`).
The ``local`` and ``vllm`` providers both train through these."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from searchr1.sdk import ConfigValueError, get_logger, setting

if TYPE_CHECKING:
    import torch

    from searchr1.kit.learner.fsdp import Sharding
    from searchr1.kit.learner.learner import Learner
    from searchr1.sdk import Config

log = get_logger()


@dataclass(frozen=True)
class LocalSettings:
    """``[model.local]``, read by the ``local`` and ``vllm`` providers through
    :func:`searchr1.sdk.plugin_settings`; ``device`` and ``dtype`` are ``[model]`` settings."""

    #: most sequences the sampler generates in one batch
    max_batch_rows: int = field(default=256, metadata={"min": 1})
    #: cache positions the sampler may hold (padding and kept caches included); 0 = derived from
    #: memory (half the GPU memory free after the load; a quarter of the machine's RAM)
    max_batch_tokens: int = field(default=0, metadata={"min": 0})
    #: padded prompt tokens per prefill forward
    prefill_chunk_tokens: int = field(default=2048, metadata={"min": 16})
    #: keep a trajectory's KV cache between its turns
    reuse_caches: bool = True
    #: how long a batch waits for stragglers before it starts
    batch_wait_ms: float = field(default=5.0, metadata={"min": 0})
    #: torch CPU threads; 0 = the cores this process may use (1 on a shared machine)
    threads: int = 0
    #: decoder positions per learner forward/backward chunk (peak memory); a prompt the chunk's
    #: rows share counts once
    learner_chunk_tokens: int = field(default=8192, metadata={"min": 1})
    #: trained positions per vocabulary projection (chunk x vocabulary logits at a time); 0 = all
    #: at once
    learner_logit_chunk: int = field(default=256, metadata={"min": 0})
    #: rows sharing an untrained prefix (a group's prompt) run it once in the learner
    learner_share_prefixes: bool = True
    #: recompute activations in backward (less memory, more time)
    gradient_checkpointing: bool | str = "auto"  # true, false or "auto" (on with CUDA)
    fsdp: bool = setting(
        False,
        help="under torchrun (searchr1 train --nproc N): shard the decoder's weights, the "
        "adapter and its optimizer state over the ranks with FSDP2 (fully_shard per decoder "
        "layer) instead of a whole copy on each; lowers the learner's memory (sampling: "
        "fsdp_sampling); ignored in one process",
    )
    fsdp_sampling: str = setting(
        "gather",
        choices=["gather", "lockstep"],
        help='with fsdp = true, how the rollout samples the sharded model: "gather" holds '
        "the whole base on every rank from each optimizer step to the next (fast; the base "
        'and the sampler\'s caches must fit one device), "lockstep" keeps it sharded and '
        "runs every rank's forwards in step, gathering one layer at a time (less memory, "
        "slower)",
    )
    #: after each optimizer step, score the step's positively-rewarded responses again (one
    #: forward without gradient over them) and log displacement/* (not under fsdp)
    likelihood_displacement: bool = True
    #: weight of the LLDS regularizer (arXiv 2512.04220; docs/training.md); 0 = off
    llds_coef: float = field(default=0.0, metadata={"min": 0.0})
    llds_gate: str = setting(
        "action",
        choices=["action", "response"],
        help="the unit whose likelihood must have fallen for LLDS to regularize its tokens: "
        '"action" (one assistant turn, the paper\'s best) or the whole "response"',
    )


def fsdp_sampling_problem(settings: LocalSettings) -> str | None:
    """What is wrong with ``[model.local] fsdp_sampling`` beside ``fsdp``; None: nothing."""
    if settings.fsdp_sampling == "lockstep" and not settings.fsdp:
        return (
            'model.local.fsdp_sampling = "lockstep" samples an FSDP2-sharded model: it needs '
            'model.local.fsdp = true (or leave fsdp_sampling = "gather")'
        )
    return None


def load_lora_model(config: Config, settings: LocalSettings) -> tuple[Any, Any, torch.device, int]:
    """Load ``[model] base_model`` (a hub id, a folder or ``builtin:NAME``) on the chosen
    device and dtype, attach a LoRA adapter from ``[lora]`` and freeze the base; returns the
    peft model, its tokenizer, the device and the sampler's token budget (:mod:`.budget`)."""
    from transformers import AutoModelForCausalLM

    from searchr1.kit.gguf import model_path
    from searchr1.kit.hub import hub_path
    from searchr1.kit.learner.budget import budget_source, token_budget
    from searchr1.kit.learner.device import (
        choose_device,
        choose_dtype,
        configure_cpu_threads,
        repeatable_cpu_kernels,
    )
    from searchr1.kit.learner.kernels import warn_if_slow_kernels
    from searchr1.kit.tokenizers import load_tokenizer

    device = choose_device(config.model.device)
    dtype = choose_dtype(config.model.dtype, device)
    threads = 0
    if device.type == "cpu":
        threads = configure_cpu_threads(settings.threads)
        repeatable_cpu_kernels()  # one seed, one run (docs/training.md)
    tokenizer = load_tokenizer(config.model.base_model, config.assets, "model.base_model")
    path = hub_path(
        model_path(config.model.base_model, config.assets), "model.base_model", "the model"
    )
    try:
        base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as exc:
        raise ConfigValueError(
            f"model.base_model = {config.model.base_model!r}: cannot load a causal LM from "
            f"{path!r}: {exc}"
        ) from exc
    base.to(device)
    warn_if_slow_kernels(base.config, device)
    model = seeded_lora(base, config)
    if checkpointing_on(settings.gradient_checkpointing, device):
        enable_checkpointing(model.get_base_model())
    budget = token_budget(settings.max_batch_tokens, base.config, dtype, device)
    log.info(
        "local_model_loaded",
        base_model=config.model.base_model,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        threads=threads,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        max_batch_tokens=budget,
        max_batch_tokens_from=budget_source(settings.max_batch_tokens, device),
    )
    return model, tokenizer, device, budget


def seeded_lora(base: Any, config: Config) -> Any:
    """``base`` with the ``[lora]`` adapter attached, its random init seeded by ``run.seed``
    (the global RNG left as it was); logs which layer types it reaches (``lora_coverage``)."""
    import torch

    from searchr1.kit.learner.lora_coverage import (
        coverage_line,
        decoder_layers,
        peft_adapted,
    )

    layers = decoder_layers(base)  # before peft wraps them: the model's own modules
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.run.seed)
        model = attach_lora(base, config)
    # Which layer types the adapter reaches: a hybrid model (Qwen3.5) with attention-only
    # targets trains a quarter of its layers, which nothing else would show.
    log.info(
        "lora_coverage",
        message=coverage_line(layers, peft_adapted(model, layers)),
        target_modules=list(config.lora.target_modules),
    )
    return model


def make_learner(
    model: Any,
    tokenizer: Any,
    device: torch.device,
    model_lock: threading.Lock,
    temperature: float,
    settings: LocalSettings,
    sharding: Sharding | None = None,
) -> Learner:
    """The learner of ``model`` (a peft model from :func:`load_lora_model`), computing
    log-probs at ``temperature`` with the ``learner_*`` settings of ``[model.local]``: a
    :class:`~searchr1.kit.learner.sharded_learner.ShardedLearner` where ``sharding``
    (``model``'s FSDP2 units) is given."""
    from searchr1.kit.learner.learner import Learner

    if settings.fsdp and sharding is None and world_size() > 1:
        raise ConfigValueError(
            "model.local.fsdp = true: only model.provider = 'local' shards its model under "
            "torchrun; set fsdp = false (the gradients are then all-reduced)"
        )
    pad = tokenizer.pad_token_id
    eos = eos_ids(model, tokenizer)
    common: dict[str, Any] = dict(
        device=device,
        model_lock=model_lock,
        context_length=int(getattr(model.config, "max_position_embeddings", 1 << 30)),
        vocab_size=int(model.get_input_embeddings().weight.shape[0]),
        temperature=temperature,
        pad_token_id=pad if pad is not None else (min(eos) if eos else 0),
        chunk_tokens=settings.learner_chunk_tokens,
        logit_chunk=settings.learner_logit_chunk,
        displacement=settings.likelihood_displacement,
        llds_coef=settings.llds_coef,
        llds_gate=settings.llds_gate,
    )
    if sharding is None:
        return Learner(model, share_prefixes=settings.learner_share_prefixes, **common)
    from searchr1.kit.learner.sharded_learner import ShardedLearner

    return ShardedLearner(model, sharding=sharding, **common)


def attach_lora(base: Any, config: Config) -> Any:
    """Freeze ``base`` and wrap it in a peft LoRA model built from ``[lora]``."""
    from peft import LoraConfig, get_peft_model

    from searchr1.kit.learner.lora_coverage import unknown_targets

    for p in base.parameters():
        p.requires_grad_(False)
    lora = config.lora
    targets: str | list[str] = list(lora.target_modules)
    if targets == ["all-linear"]:
        # peft's shorthand: every linear layer but the output head, whatever the family
        # calls its projections, so one config fits Qwen3, Qwen3.5, Llama, Mixtral...
        targets = "all-linear"
    # the rule config check applies to the meta-device model (lora_coverage.check_model)
    if problem := unknown_targets(base, lora.target_modules, config.model.base_model):
        raise ConfigValueError(problem)
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        bias="none",
    )
    with warnings.catch_warnings():
        # peft 0.21 probes transformers' deprecated `is_gradient_checkpointing`; the warning is
        # about peft's code, not the user's, and would print on every run
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(base, peft_config)


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that always end a sample: the tokenizer's eos and the model's generation
    eos ids (Qwen lists both ``<|endoftext|>`` and ``<|im_end|>`` there)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    return sorted(ids)


def world_size() -> int:
    """The torchrun job's process count (1 outside one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def checkpointing_on(setting: bool | str, device: torch.device) -> bool:
    """``[model.local] gradient_checkpointing``: "auto" turns it on with CUDA, where long
    datums of a multi-billion-parameter model would otherwise keep every layer's
    activations; on the CPU (tiny models) recomputation only costs time."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ConfigValueError(
            f'model.local.gradient_checkpointing = {setting!r}: use true, false or "auto"'
        )
    return device.type == "cuda"


def enable_checkpointing(base: Any) -> None:
    """Recompute activations in backward. Non-reentrant checkpointing works with a frozen
    base (no input grads needed). transformers 5 renamed the method (the old name warns)."""
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
