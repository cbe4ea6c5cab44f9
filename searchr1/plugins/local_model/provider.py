"""``LocalModelProvider``: sampling and LoRA training of one model in this process.

The rollout awaits :meth:`sample` (batched by
:class:`~searchr1.plugins.local_model.sampler.BatchedSampler`); the train loop queues
:meth:`forward_backward` and awaits :meth:`optim_step`, run in the learner's worker thread
(:class:`~searchr1.kit.learner.learner.Learner`), on the same peft model. Settings:
``[model.local]`` (docs/reference/config.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from searchr1.kit.learner.loading import (
    LocalSettings,
    attach_lora,
    checkpointing_on,
    eos_ids,
    fsdp_sampling_problem,
    load_lora_model,
    make_learner,
    world_size,
)
from searchr1.kit.learner.trainer import LearnerTrainer, Publish
from searchr1.sdk import ConfigValueError, SampledSequence, SamplingParams, plugin_settings

if TYPE_CHECKING:
    import torch

    from searchr1.kit.learner.fsdp import Lockstep, Sharding
    from searchr1.plugins.local_model.sampler import BatchedSampler
    from searchr1.sdk import Config

#: what this module offered before the learner's loading moved to searchr1.kit.learner.loading
__all__ = [
    "LocalModelProvider",
    "LocalSettings",
    "attach_lora",
    "fsdp_sampling_problem",
    "load_lora_model",
    "make_learner",
]


class LocalModelProvider(LearnerTrainer, Publish):
    """A local transformers model + LoRA, both the :class:`~searchr1.core.types.Sampler` and
    the :class:`~searchr1.core.types.Trainer` of the ``local`` provider's
    :class:`~searchr1.core.types.Model` (one object: both use the same peft model). The
    trainer is the :class:`~searchr1.kit.learner.trainer.LearnerTrainer`; its publish step swaps the sampler's
    copy of the weights in this process."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: torch.device,
        temperature: float,
        settings: LocalSettings | None = None,
        seed: int = 0,
        max_batch_tokens: int = 1 << 20,
        sharding: Sharding | None = None,
    ) -> None:
        """``model`` is a peft model with the adapter attached and the base frozen (see
        :meth:`from_config`). ``temperature`` is the rollout's sampling temperature, at which
        the learner computes log-probs. ``max_batch_tokens`` is the sampler's token budget
        when ``settings`` leaves it 0 (:meth:`from_config` derives it, :mod:`searchr1.kit.learner.budget`).
        ``sharding``: ``model``'s FSDP2 units (:func:`searchr1.kit.learner.fsdp.shard_model`), or None."""
        from searchr1.plugins.local_model.snapshot import SamplerWeights

        settings = settings or LocalSettings()
        self.model = model
        #: the Hugging Face tokenizer of the base model (chat template included)
        self.tokenizer = tokenizer
        self.device = device
        self.model_lock = threading.Lock()
        # The sampler enters the model through this (a drop-in for the lock): it swaps in
        # the pinned adapter version once snapshot_sampler() was called.
        self.sampler_weights = SamplerWeights(model, self.model_lock)
        learner = make_learner(
            model, tokenizer, device, self.model_lock, temperature, settings, sharding
        )
        LearnerTrainer.__init__(self, learner, publish=self)
        self.context_length = self.learner.context_length
        self.vocab_size = self.learner.vocab_size
        lockstep = None
        if sharding is not None and sharding.lockstep:
            from searchr1.kit.learner.fsdp import Lockstep

            lockstep = Lockstep(model, device, self.learner.pad_token_id, sharding.group)
        self.sampler = self._make_sampler(settings, seed, max_batch_tokens, lockstep)
        self.sampler_weights.on_new_version = self.sampler.retained.clear
        if sharding is not None:
            from searchr1.kit.learner.sharded_learner import ShardedLearner

            assert isinstance(self.learner, ShardedLearner)
            # every rank constructs the provider at the same point; with lockstep sampling
            # this gathers the adapter for a checkpoint before the first step
            self.learner.sampling_phase()
            if lockstep is not None:
                self.sampler.begin_session()

    def _make_sampler(
        self,
        settings: LocalSettings,
        seed: int,
        max_batch_tokens: int,
        lockstep: Lockstep | None,
    ) -> BatchedSampler:
        """The batched sampler over the same model, entered through the pinned weights."""
        from searchr1.kit.learner.budget import row_overhead_tokens
        from searchr1.plugins.local_model.sampler import BatchedSampler

        model = self.model
        return BatchedSampler(
            model,
            self.tokenizer,
            device=self.device,
            model_lock=self.sampler_weights,  # type: ignore[arg-type]
            context_length=self.context_length,
            eos_token_ids=eos_ids(model, self.tokenizer),
            pad_token_id=self.learner.pad_token_id,
            vocab_size=self.vocab_size,
            max_batch_rows=settings.max_batch_rows,
            max_batch_tokens=settings.max_batch_tokens or max_batch_tokens,
            row_tokens=row_overhead_tokens(model.config, next(model.parameters()).dtype),
            prefill_chunk_tokens=settings.prefill_chunk_tokens,
            reuse=settings.reuse_caches,
            batch_wait_s=settings.batch_wait_ms / 1000.0,
            seed=seed,
            lockstep=lockstep,
            # A running batch admits newly queued requests between decoding steps; one
            # queued after snapshot_sampler() waits for a batch of its own, on the new weights.
            may_join=self.sampler_weights.running_pinned,
        )

    @classmethod
    def from_config(cls, config: Config) -> LocalModelProvider:
        """Load the model with a LoRA adapter (:func:`load_lora_model`) for sampling and
        training in this process."""
        settings = plugin_settings(config, "model", "local", LocalSettings)
        if problem := fsdp_sampling_problem(settings):
            raise ConfigValueError(problem)
        model, tokenizer, device, budget = load_lora_model(config, settings)
        sharding = None
        if settings.fsdp and world_size() > 1:
            from searchr1.kit.learner.fsdp import shard_model

            if checkpointing_on(settings.gradient_checkpointing, device):
                # FSDP + LoRA + checkpointing: recomputed layers need an input that requires
                # grad to reach the adapter (the base, embeddings included, is frozen)
                model.enable_input_require_grads()
            sharding = shard_model(model, device, lockstep=settings.fsdp_sampling == "lockstep")
        return cls(
            model,
            tokenizer,
            device=device,
            temperature=config.model.temperature,
            settings=settings,
            seed=config.run.seed,
            max_batch_tokens=budget,
            sharding=sharding,
        )

    # ------------------------------------------------------------------ Sampler, publish step

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt_tokens``; batched with every other call
        in flight."""
        return await self.sampler.sample(prompt_tokens, num_samples, params)

    @property
    def generator(self) -> torch.Generator:
        """The sampler's random generator (saved with the learner's state)."""
        return self.sampler._generator

    def session(self) -> AbstractContextManager[None]:
        return self.sampler.outside_session()  # a collective under FSDP lockstep

    def training(self) -> None:
        # Training follows the rollout: caches kept for further turns are stale from here on,
        # and their memory is the learner's now. (Pinned, they stay valid: the sampler keeps
        # its weights, and the next rollout may be using them right now.)
        if not self.sampler_weights.pinned:
            self.sampler.forget()

    def save_weights(self) -> None:
        """The sampler's copy of the new weights (once pinning is in use)."""
        self.sampler_weights.publish()

    async def pin(self) -> None:
        self.sampler_weights.pin()

    def before_load(self) -> None:
        self.sampler.forget()
        self.sampler_weights.reset()

    def release(self) -> None:
        self.sampler.close()
