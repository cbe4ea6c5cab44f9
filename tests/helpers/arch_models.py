"""Tiny random-init models of real decoder families, built in a test, loaded by path.

Each builder makes a transformers config class of the family (no download), random weights,
and saves it with ``save_pretrained`` next to the project's built-in tokenizer, so the test
loads it through ``AutoModelForCausalLM.from_pretrained(folder)`` like a hub model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, EOS_TOKEN, build_tokenizer

FAMILIES = (
    "qwen3",
    "qwen3_5",
    "qwen3_next",
    "mistral_sliding",
    "gemma3_mixed",
    "qwen3_moe",
    "llama",
)


def _common(vocab: int, eos: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=False,
        # Wider than the default 0.02, so next-token distributions are far from uniform and
        # a wrong cache changes which tokens are sampled, not only their log-probs.
        initializer_range=0.2,
    )


def family_config(family: str, vocab: int, eos: int) -> Any:
    """The transformers config of a tiny model of ``family`` (one of :data:`FAMILIES`)."""
    import transformers as tf

    c = _common(vocab, eos)
    if family == "qwen3":
        return tf.Qwen3Config(num_hidden_layers=2, **c)
    if family == "qwen3_5":
        # Qwen3.5: Gated DeltaNet linear attention in 3 of 4 layers, gated full attention in
        # the 4th (the hidden size 128 of the report).
        c.update(hidden_size=128, head_dim=32)
        return tf.Qwen3_5TextConfig(
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            **c,
        )
    if family == "qwen3_next":
        # At 0.2 the sampler's step-by-step (recurrent) and the learner's chunked form of
        # transformers' reference Gated DeltaNet drift apart by ~1.5e-4 on long second turns,
        # with or without our cache reuse; 0.1 keeps the states in a realistic range.
        c.update(initializer_range=0.1)
        return tf.Qwen3NextConfig(
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **c,
        )
    if family == "mistral_sliding":
        return tf.MistralConfig(num_hidden_layers=2, sliding_window=8, **c)
    if family == "gemma3_mixed":
        # Gemma 3: sliding-window layers interleaved with full-attention ones (one cache with
        # both layer kinds).
        return tf.Gemma3TextConfig(
            num_hidden_layers=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            **c,
        )
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **c
        )
    if family == "llama":
        return tf.LlamaConfig(num_hidden_layers=2, **c)
    raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")


def build_family(family: str, folder: Path, seed: int = 0) -> Path:
    """Save a tiny random ``family`` model and the built-in tokenizer into ``folder``."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(BUILTIN_TEXT, vocab_size=600)
    tokenizer.model_max_length = 1024
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = family_config(family, len(tokenizer), eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.to(torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
