"""``LearnerTrainer``: the :class:`~searchr1.sdk.Trainer` around a local learner, with a publish step.

The learner (log-probs, loss, backward, AdamW in its worker thread) trains a peft model; after
each optimizer step a :class:`Publish` step hands the new weights to whatever samples: the
``local`` provider swaps its in-process sampler's copy, the ``vllm`` provider saves the adapter
and loads it into its servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from searchr1.sdk import AdamParams, Datum, ForwardBackwardResult, LossFn, TrainerCapabilities

if TYPE_CHECKING:
    from searchr1.kit.learner.learner import Learner


class Publish:
    """Where a learner's weights go for sampling: the hooks :class:`LearnerTrainer` calls. Each
    does nothing here; a provider overrides what its sampler needs. Hooks run on the event
    loop, except :meth:`save_weights` (in the learner's worker)."""

    #: the sampler's random generator, saved and restored with the learner's state (or None)
    generator: Any = None

    def session(self) -> AbstractContextManager[Any]:
        """Held around learner work in which a torchrun job's ranks meet (the optimizer step,
        pinning the KL reference, loading a checkpoint)."""
        return nullcontext()

    def training(self) -> None:
        """Training work is about to be queued: the rollout before it is over."""

    def save_weights(self) -> Any:
        """In the learner's worker, right after the optimizer step: hand the new weights over
        (what :meth:`publish` is given)."""
        return None

    async def publish(self, saved: Any) -> Mapping[str, float]:
        """Sample the weights :meth:`save_weights` handed over from now on; metrics to add to
        the step's."""
        return {}

    async def pin(self) -> None:
        """Sample the newest published weights, and only them, until the next call."""

    def before_load(self) -> None:
        """Other weights are about to be loaded (:meth:`LearnerTrainer.load_state`)."""

    async def after_load(self) -> None:
        """The loaded weights are the newest: sample them."""

    def release(self) -> None:
        """Stop the sampler's side, before the learner's worker stops."""


class LearnerTrainer:
    """The trainer of a local :class:`~searchr1.kit.learner.learner.Learner`:
    ``forward_backward`` queued in the learner's worker, ``optim_step`` there too and then
    ``publish``; checkpoints of the learner's state (and the sampler's generator)."""

    def __init__(self, learner: Learner, publish: Publish) -> None:
        self.learner = learner
        self.publish_step = publish

    @property
    def capabilities(self) -> TrainerCapabilities:
        """Any loss (the learner calls it), a snapshot sampler (the publish step's pin), a KL
        reference, the learner's temperature (the rollout's, so on-policy ratios are 1), and
        data parallelism under torchrun (the learner sums the ranks' gradients)."""
        return TrainerCapabilities(
            snapshot_sampler=self.snapshot_sampler,
            kl_reference=self.pin_reference,
            learner_temperature=float(self.learner.temperature),
            data_parallel=True,
        )

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Awaitable[ForwardBackwardResult]:
        """Queue the learner's ``forward_backward`` in its worker thread; the awaitable of its
        result."""
        self.publish_step.training()
        return asyncio.wrap_future(self.learner.submit(datums, loss_fn, loss_scale))

    async def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """The learner's step behind the queued micro-batches and the new weights' hand-over,
        in its worker thread; then their publication."""
        self.publish_step.training()
        step = self.learner.worker.submit(self._step, adam)
        metrics, saved = await asyncio.wrap_future(step)
        metrics.update(await self.publish_step.publish(saved))
        return metrics

    def _step(self, adam: AdamParams) -> tuple[dict[str, float], Any]:
        with self.publish_step.session():
            metrics = dict(self.learner.optim_step(adam))
        return metrics, self.publish_step.save_weights()

    def pin_reference(self) -> None:
        """Keep the current weights as the KL reference."""
        with self.publish_step.session():
            self.learner.pin_reference()

    async def snapshot_sampler(self) -> None:
        """Sample on the newest trained weights from now on, and on them alone until the next
        call (declared as :attr:`~searchr1.sdk.TrainerCapabilities.snapshot_sampler`; the
        train loop calls it at the start of each rollout when ``train.max_staleness > 0``)."""
        await self.publish_step.pin()

    def save_state(self, path: str) -> None:
        self.learner.save_state(path, self.publish_step.generator)

    async def load_state(self, path: str) -> None:
        """Load a checkpoint's learner state, then publish it."""
        self.publish_step.before_load()
        with self.publish_step.session():
            self.learner.load_state(path, self.publish_step.generator)
        await self.publish_step.after_load()

    def close(self) -> None:
        self.publish_step.release()
        self.learner.worker.shutdown()
