"""The learner of an FSDP2-sharded model (``[model.local] fsdp = true`` under torchrun).

:class:`ShardedLearner` is a :class:`~searchr1.kit.learner.learner.Learner` whose
model's decoder is sharded over the ranks (:func:`.fsdp.shard_model`). Every forward and
backward of that model is a collective (each unit's weights are all-gathered, its
gradients reduce-scattered), so the ranks must run the same number of them, in step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from searchr1.kit.learner.fsdp import (
    Sharding,
    full_optimizer_state,
    is_sharded,
    load_optimizer_state,
    max_over_ranks,
    whole,
)
from searchr1.kit.learner.learner import Learner, merge_chunks, scoring_mode
from searchr1.sdk import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    LossInputs,
    LossOutput,
    kl_coef,
)


class ShardedLearner(Learner):
    """The :class:`~searchr1.kit.learner.learner.Learner` of a model sharded by
    ``sharding`` (module docstring); every rank holds one and calls its collectives
    (:meth:`optim_step`, :meth:`load_state`, :meth:`sampling_phase`) at the same points."""

    def __init__(self, model: Any, *, sharding: Sharding, **learner: Any) -> None:
        """``sharding``: the FSDP2 units of ``model`` (:func:`.fsdp.shard_model`, applied
        before this); ``learner``: :class:`Learner`'s keyword arguments but
        ``share_prefixes`` (off: module docstring) and ``displacement`` (off)."""
        # no likelihood displacement: its extra forward would be a collective some ranks
        # skip (a rank without positive responses)
        super().__init__(model, share_prefixes=False, **{**learner, "displacement": False})
        self.sharding = sharding
        # the step's micro-batches, run by optim_step
        self._queued: list[tuple[list[Datum], LossFn, float, Future[ForwardBackwardResult]]] = []
        # the optimizer state gathered whole after the last step (rank 0 saves it)
        self._whole_optimizer: dict[str, Any] | None = None
        # with lockstep sampling: the adapter likewise (the weights stay sharded)
        self._whole_adapter: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ forward/backward

    def submit(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Future[ForwardBackwardResult]:
        """Queue the micro-batch for the next :meth:`optim_step`, which fills in the
        returned future (module docstring)."""
        self._check_datums(datums)
        result: Future[ForwardBackwardResult] = Future()
        self.worker.submit(self._queued.append, (list(datums), loss_fn, loss_scale, result))
        return result

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        """Refused: one rank alone cannot run a sharded model's forward."""
        raise RuntimeError(
            "[model.local] fsdp = true: forward_backward runs in optim_step, where every "
            "rank runs the step's micro-batches in step; queue it with submit()"
        )

    def _run_queued(self) -> None:
        """The queued micro-batches' chunks, as many forwards and backwards on every rank
        (module docstring); each queued result is filled in."""
        queued, self._queued = self._queued, []
        self.sharding.for_learning()
        plan = [(i, c) for i, (datums, *_) in enumerate(queued) for c in self._chunks(datums)]
        kl = any(kl_coef(loss_fn) > 0 for _, loss_fn, _, _ in queued)
        count, reference = max_over_ranks([len(plan), int(kl)], self.device)
        idle = _idle_datum(self.vocab_size)
        parts: dict[int, list[tuple[float, Mapping[str, float], dict[str, float]]]] = {}
        with scoring_mode(self.model):
            if self._chunked_ok is None:  # the same input on every rank: the same answer
                self._use_chunked(*self._idle_tensors(idle))
            for k in range(count):
                if k < len(plan):
                    i, chunk = plan[k]
                    _, loss_fn, scale, _ = queued[i]
                    out = self._forward_backward_chunk(chunk, loss_fn, scale, bool(reference))
                    parts.setdefault(i, []).append(out)
                else:  # this rank has run out: a zero-weight chunk, for the collectives
                    self._forward_backward_chunk([idle], _IDLE_LOSS, 0.0, bool(reference))
        for i, (datums, _, _, result) in enumerate(queued):
            result.set_result(merge_chunks(parts[i], len(datums)))

    def _idle_tensors(self, idle: Datum) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.tensor([idle.input_tokens], device=self.device)
        targets = torch.tensor([idle.target_tokens], device=self.device)
        trained = torch.tensor([idle.sampled], device=self.device)
        return ids, targets, trained

    # ------------------------------------------------------------------ optimizer

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """The step's queued micro-batches, then the AdamW step of
        :meth:`Learner.optim_step <searchr1.kit.learner.learner.Learner.optim_step>`;
        then what rank 0 saves is gathered and the weights go back to the sampler's phase
        (module docstring). A collective: every rank calls it."""
        with self.model_lock:
            self._run_queued()
            grad_norm = self._update(adam)
            # every rank is here: gather what rank 0 alone will save, then the weights
            self._whole_optimizer = full_optimizer_state(self.optimizer)
            self.sampling_phase()
        return {"grad_norm": grad_norm, "lr": adam.learning_rate, "step": float(self.step)}

    def _summed_grad_norm(self) -> tuple[torch.Tensor | None, float]:
        # FSDP reduce-scattered its parameters' gradients already; only the parameters
        # outside its units (whole on every rank) are all-reduced
        from searchr1.sdk import all_reduce_grads

        all_reduce_grads([p for p in self.params if not is_sharded(p)])
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return None, 0.0
        norm = torch.nn.utils.get_total_norm(grads)
        return norm, float(whole(norm))

    def sampling_phase(self) -> None:
        """The weights as the sampler runs them between steps (:meth:`.fsdp.Sharding.for_sampling`)
        and, with lockstep sampling (the weights stay sharded), the adapter gathered whole
        for :meth:`save_state`. A collective: every rank calls it at the same point (after
        each step and load, and once when the provider is made)."""
        self.sharding.for_sampling()
        if self.sharding.lockstep:
            self._whole_adapter = {
                n: whole(p.detach()).clone()
                for n, p in zip(self.param_names, self.params, strict=True)
            }

    # ------------------------------------------------------------------ checkpoints

    def _saved_state(self) -> tuple[Mapping[str, torch.Tensor], Mapping[str, Any]]:
        """The whole adapter and optimizer state, as gathered after the last step (rank 0
        alone saves them)."""
        optimizer = self._whole_optimizer or self.optimizer.state_dict()
        if self.sharding.lockstep:
            assert self._whole_adapter is not None, "FSDP: save_state between steps only"
            return self._whole_adapter, optimizer
        # between steps the weights are gathered whole (fsdp.py)
        assert self.sharding.sampling, "FSDP: save_state between steps only"
        named = dict(self.model.named_parameters())
        return {n: named[n].detach() for n in self.param_names}, optimizer

    def _load(self, path: str, sampler_gen: Any) -> int:
        """Every rank reads the whole adapter and optimizer state and keeps its shard of
        them (a collective)."""
        import searchr1.kit.learner.state as state

        self.sharding.for_learning()  # the shards are what training and saving read

        def load_optimizer(saved: Mapping[str, Any]) -> None:
            load_optimizer_state(self.optimizer, self.params, saved)
            self._whole_optimizer = dict(saved)

        try:
            return state.load_state(
                path, self.model, self.optimizer, sampler_gen, load_optimizer=load_optimizer
            )
        finally:
            self.sampling_phase()


def _idle_datum(vocab_size: int) -> Datum:
    """What a rank with no chunk left runs (with weight 0): a few tokens, one trained."""
    tokens = tuple(i % vocab_size for i in range(8))
    advantages = (0.0,) * 7 + (1.0,)
    return Datum(tokens, tokens, (0.0,) * 8, advantages, trajectory_id="fsdp-idle")


class _IdleLoss:
    """The loss of an idle chunk: the log-probs' sum (scaled by 0, it adds nothing)."""

    settings: Mapping[str, float] = {}

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput:
        return LossOutput(loss=logprobs_T.sum(), metrics={})


_IDLE_LOSS = _IdleLoss()
