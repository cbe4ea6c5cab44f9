"""What the remote providers (``taotoken``, ``tinker``) say about a config before it runs.

The registered factories carry :func:`advise` (see ``docs/plugins.md``, "What a factory may
declare"); ``config check``, ``smoke`` and ``train`` print each line as a warning. A
Tinker-shaped service is told the LoRA rank and which layer groups to adapt, nothing more,
and samples tempered while it trains untempered; each line names a setting it cannot honour
as written and what happens instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchr1.plugins.remote_model.conversions import ATTENTION, MLP

if TYPE_CHECKING:
    from searchr1.sdk import Config


def advise(config: Config) -> list[str]:
    """Every setting the remote provider ignores or maps coarsely, with what happens instead."""
    out = _lora_notes(config, config.model.provider)
    if config.model.temperature != 1.0:
        out.append(temperature_note(config))
    return out


def temperature_note(config: Config) -> str:
    """What the importance ratio compares when a remote service samples at ``temperature``
    but trains untempered; said at start of every run, the run goes on."""
    t = config.model.temperature
    return (
        f"model.temperature = {t:g} on provider {config.model.provider!r}: the service samples "
        f"at temperature {t:g} but computes the learner's log-probs untempered (T = 1), so the "
        f"importance ratio exp(learner - sampler) compares the untempered policy with the "
        f"tempered sampling distribution and is not 1 even on-policy. The run uses {t:g} as "
        f"set; each step's metrics log the gap as mismatch/kl_sample_train and ratio_mean "
        f"(0 and 1.0 when both agree)"
    )


def _lora_notes(config: Config, provider: str) -> list[str]:
    out = []
    lora, explicit = config.lora, config.explicit
    if "lora.alpha" in explicit:
        out.append(
            f"lora.alpha = {lora.alpha:g} is not sent to provider {provider!r} (its SDK has no "
            f"such parameter): the service applies its own LoRA scaling"
        )
    if "lora.dropout" in explicit:
        out.append(
            f"lora.dropout = {lora.dropout:g} is not sent to provider {provider!r} (its SDK has "
            f"no such parameter): the service applies its own dropout (if any)"
        )
    targets = set(lora.target_modules)
    groups = {"attention": ATTENTION, "MLP": MLP, "unembedding": ("lm_head",)}
    partial = [
        f"{name} ({', '.join(mods)})"
        for name, mods in groups.items()
        if targets & set(mods) and not set(mods) <= targets
    ]
    unknown = sorted(targets - set(ATTENTION) - set(MLP) - {"lm_head"})
    if partial:
        out.append(
            f"lora.target_modules = {list(lora.target_modules)} is mapped to whole layer groups "
            f"by provider {provider!r}: it adapts every module of {'; '.join(partial)}"
        )
    if unknown:
        out.append(
            f"lora.target_modules {unknown} have no counterpart on provider {provider!r} (it "
            f"adapts attention, MLP and unembedding groups only): they are ignored"
        )
    return out
