"""``check_request``: a ``sample()`` call's arguments checked before a sampler runs them, so a
bad request raises in its caller (the local and the vLLM samplers use it)."""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.sdk import SamplingParams


def check_request(
    prompt_tokens: Sequence[int],
    num_samples: int,
    params: SamplingParams,
    *,
    vocab_size: int,
    context_length: int,
    context: str = "the model's context",
) -> list[int]:
    """The prompt as a list of ints; ValueError naming the argument for anything a batch
    could not run (an empty prompt, ids outside the vocabulary, a prompt that fills
    ``context``, out-of-range sampling parameters)."""
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise ValueError("sample(): prompt_tokens is empty")
    if num_samples < 1:
        raise ValueError(f"sample(): num_samples must be >= 1, got {num_samples}")
    if params.max_tokens < 1:
        raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if any(not isinstance(x, str) or not x for x in params.stop_strings):
        raise ValueError(
            f"SamplingParams.stop_strings must be non-empty strings, got {params.stop_strings!r}"
        )
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"sample(): prompt_tokens holds ids outside the vocabulary "
            f"(size {vocab_size}): {bad[:5]}"
        )
    if len(prompt) >= context_length:
        raise ValueError(
            f"sample(): the prompt has {len(prompt)} tokens, {context} is "
            f"{context_length}; nothing can be generated"
        )
    return prompt
