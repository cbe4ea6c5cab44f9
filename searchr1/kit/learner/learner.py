"""Log-probs of datums, loss, backward and the AdamW step over the LoRA parameters.

:class:`Learner` runs ``forward_backward`` and ``optim_step`` in its one worker thread, in call
order, at the sampler's temperature and with dropout off, projecting only the sampled tokens
onto the vocabulary; every call reports the sampler/learner mismatch. Why: docs/internals.md,
"The learner".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

from searchr1.kit.learner.chunked_logprobs import (
    causal_lm,
    chunked_token_logprobs,
    matches_model_logits,
    target_logprobs,
)
from searchr1.kit.learner.llds import action_segments, llds_penalty, response_segments
from searchr1.kit.learner.reference import ReferencePolicy
from searchr1.kit.learner.shared_prefix import (
    can_share_prefixes,
    checkpointing,
    decoder_tokens,
    first_sampled,
    prefix_groups,
    shared_prefix_logprobs,
)
from searchr1.sdk import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    LossInputs,
    displacement_from_logprobs,
    kl_coef,
    merge_train_metrics,
    mismatch_from_logprobs,
)


def token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    targets_BT: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[target]`` per position, right-padded batch (every
    position: what :func:`trained_token_logprobs` must equal on its columns)."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=mask_BT, use_cache=False).logits
    return target_logprobs(logits_BTV, targets_BT, temperature)


def trained_token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    targets_BT: torch.Tensor,
    temperature: float,
    columns_K: torch.Tensor,
) -> torch.Tensor:
    """:func:`token_logprobs` for the sequence positions ``columns_K`` only (``B x K``).

    The vocabulary projection and log-softmax run only where a trained token is predicted:
    prompt and observation positions carry advantage 0 and add nothing to any policy loss,
    yet they are most of a datum. Uses the model's own ``logits_to_keep`` (so any logit
    scaling the model applies is kept; the sampler's prefill needs it too)."""
    logits_BKV = model(
        input_ids=input_ids_BT, attention_mask=mask_BT, use_cache=False, logits_to_keep=columns_K
    ).logits
    return target_logprobs(logits_BKV, targets_BT[:, columns_K], temperature)


@contextmanager
def scoring_mode(model: Any) -> Iterator[None]:
    """The model in eval mode (every dropout off, as when sampling), except that decoder
    layers with gradient checkpointing on keep ``training = True`` (on that module only) so
    that they still checkpoint. Restores each module's previous mode on exit."""
    previous = {m: m.training for m in model.modules()}
    model.eval()
    for m in model.modules():
        checkpoints = getattr(m, "gradient_checkpointing", False) is True
        if checkpoints and hasattr(m, "_gradient_checkpointing_func"):
            m.training = True
    try:
        yield
    finally:
        for m, mode in previous.items():
            m.training = mode


def dropout_probabilities(model: Any) -> list[float]:
    """The non-zero ``p`` of every dropout module in ``model`` (LoRA's included)."""
    return [
        float(m.p)
        for m in model.modules()
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
    ]


class Learner:
    """Gradient accumulation and optimizer of one provider: one process, or one rank of
    data-parallel training under torchrun (the gradients summed over the ranks in
    :meth:`optim_step`). Shares ``model_lock`` with the sampler so sampling never
    interleaves with a backward pass or a weight update. A sharded model has its own
    learner (:class:`~searchr1.kit.learner.sharded_learner.ShardedLearner`)."""

    def __init__(
        self,
        model: Any,
        *,
        device: torch.device,
        model_lock: threading.Lock,
        context_length: int,
        vocab_size: int,
        temperature: float,
        pad_token_id: int,
        chunk_tokens: int = 8192,
        logit_chunk: int = 256,
        share_prefixes: bool = True,
        displacement: bool = True,
        llds_coef: float = 0.0,
        llds_gate: str = "action",
    ) -> None:
        self.model = model
        self.device = device
        self.model_lock = model_lock
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.chunk_tokens = chunk_tokens
        # Trained positions per vocabulary-projection chunk (chunked_logprobs.py); 0 = all
        # of a micro-batch's in one projection.
        self.logit_chunk = logit_chunk
        # Whether the chunked path reproduces this model's own logits: checked once, on the
        # first micro-batch (None until then).
        self._chunked_ok: bool | None = None
        # Rows sharing an untrained prefix (a group's prompt) run it once (shared_prefix.py):
        # None until checked against the unshared path on a first micro-batch that shares.
        self._shared_ok: bool | None = (
            None if share_prefixes and can_share_prefixes(model) else False
        )
        # a queued forward_backward's failure, raised by the next optim_step
        self._failed: BaseException | None = None
        #: score the step's positive responses again after optim_step (module docstring)
        self.displacement = displacement
        # the step's positive responses so far: (datum, summed log-prob before the update)
        self._positive: list[tuple[Datum, float]] = []
        #: the LLDS regularizer's weight (0 = off) and unit (:mod:`.llds`)
        self.llds_coef = llds_coef
        self.llds_gate = llds_gate
        self._init_training(model, device)

    def _init_training(self, model: Any, device: torch.device) -> None:
        """The worker thread, the trainable parameters and their optimizer, and the KL
        term's reference policy; dropout, which the learner turns off, is logged."""
        #: the one thread that runs the learner's torch work, in call order (:meth:`submit`)
        self.worker = ThreadPoolExecutor(
            1, thread_name_prefix="searchr1-learner", initializer=_use_device, initargs=(device,)
        )
        self.param_names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters (is the LoRA adapter on?)")
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-5)
        self.step = 0
        #: the KL term's reference policy (``[train.loss] kl_coef``)
        self.reference = ReferencePolicy(model)
        dropout = dropout_probabilities(model)
        if dropout:
            from searchr1.sdk import get_logger

            get_logger().info(
                "learner_dropout_off",
                dropout=max(dropout),
                message="dropout (lora.dropout included) is off when the learner scores the "
                "policy, so on-policy importance ratios are 1; see learner.py",
            )

    # ------------------------------------------------------------------ forward/backward

    def submit(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Future[ForwardBackwardResult]:
        """Queue :meth:`forward_backward` in :attr:`worker`, behind what was queued before."""
        self._check_datums(datums)  # a bad datum fails here, before anything is queued
        return self.worker.submit(self._queued_call, datums, loss_fn, loss_scale)

    def _queued_call(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float
    ) -> ForwardBackwardResult:
        """:meth:`forward_backward` in the worker; a failure is kept for the next
        :meth:`optim_step`, which raises it instead of stepping on part of the gradients."""
        try:
            return self.forward_backward(datums, loss_fn, loss_scale)
        except BaseException as exc:
            self._failed = exc
            raise

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        """Accumulate the gradient of ``loss_scale * sum(loss_fn over datums)``, now (in the
        calling thread).

        The datums are processed in chunks of at most ``chunk_tokens`` positions of decoder
        work (:meth:`_chunks`; the loss is a sum, so chunking changes nothing but peak
        memory). Returns the unscaled summed loss and metrics: the loss's own sums
        (``tokens``, ``ratio_sum``, ``clipped_tokens``, ...; the core derives the means once,
        :func:`~searchr1.core.step_metrics.ratio_metrics`) and the ``mismatch/*`` sums and
        extremes of the module docstring. Dropout is off (module docstring)."""
        self._check_datums(datums)
        with self.model_lock, scoring_mode(self.model):
            parts = [
                self._forward_backward_chunk(chunk, loss_fn, loss_scale)
                for chunk in self._chunks(datums)
            ]
        return merge_chunks(parts, len(datums))

    def _check_datums(self, datums: Sequence[Datum]) -> None:
        if not datums:
            raise ValueError("forward_backward(): no datums")
        for d in datums:
            self._check_datum(d)

    def _check_datum(self, d: Datum) -> None:
        name = d.trajectory_id or "?"
        if len(d) == 0:
            raise ValueError(f"datum {name}: empty")
        if len(d) > self.context_length:
            raise ValueError(
                f"datum {name} (trajectory_id={d.trajectory_id!r}) has {len(d)} tokens, more "
                f"than the model's context of {self.context_length}; lower "
                f"rollout.max_trajectory_tokens / train.max_datum_tokens"
            )
        for field in ("input_tokens", "target_tokens"):
            bad = [t for t in getattr(d, field) if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"datum {name}: {field} holds ids outside the vocabulary "
                    f"(size {self.vocab_size}): {bad[:5]}"
                )

    def _chunks(self, datums: Sequence[Datum]) -> list[list[Datum]]:
        """``datums`` in order, cut where the next would take a chunk's decoder work past
        ``chunk_tokens`` positions (:func:`.shared_prefix.decoder_tokens`: a prompt its rows
        share counts once when the forward with gradient shares it: the chunked path, a model
        it fits, no checkpointing); at least one each."""
        share = (
            self._shared_ok is not False
            and self._chunked_ok is not False
            and not checkpointing(self.model)
        )
        chunks: list[list[Datum]] = [[]]
        inputs: list[tuple[int, ...]] = []
        first: list[int] = []
        for d in datums:
            inputs.append(d.input_tokens)
            first.append(first_sampled(d.sampled))
            if chunks[-1] and decoder_tokens(inputs, first, share) > self.chunk_tokens:
                chunks.append([])
                inputs, first = inputs[-1:], first[-1:]
            chunks[-1].append(d)
        return chunks

    def _forward_backward_chunk(
        self, datums: list[Datum], loss_fn: LossFn, loss_scale: float, reference: bool = False
    ) -> tuple[float, Mapping[str, float], dict[str, float]]:
        """One chunk's forward and backward; ``reference``: run the KL reference's forward
        even when this loss has no KL term (a sharded model's: some rank's loss has one)."""
        dev = self.device
        ids_BT, mask_BT, targets_BT, trained_BT, sampler_BT, adv_BT, weight_BT = self._batch(datums)
        b, width = ids_BT.shape
        # Only sampled positions enter a loss (docs/protocols.md §5): the model still reads
        # every position, but logits are computed only there. logprobs_T and the loss inputs
        # are in row-major order of trained_BT.
        use_chunked = self._use_chunked(ids_BT, targets_BT, trained_BT)
        tensors = (ids_BT, mask_BT, targets_BT, trained_BT)
        reference_T = None
        if kl_coef(loss_fn) > 0 or reference:
            # Before the policy's forward: the reference swaps adapter tensors, which must
            # not change under a graph that backward still needs.
            with torch.no_grad(), self.reference.active():
                reference_T = self._scored(use_chunked, datums, tensors)
        logprobs_T = self._scored(use_chunked, datums, tensors)
        inputs = LossInputs(
            sampler_logprobs_T=sampler_BT.to(dev)[trained_BT],
            advantages_T=adv_BT.to(dev)[trained_BT],
            reference_logprobs_T=reference_T,
            weights_T=weight_BT.to(dev)[trained_BT],
            sequence_T=torch.arange(b, device=dev).unsqueeze(1).expand(b, width)[trained_BT],
        )
        output = loss_fn(logprobs_T, inputs)
        loss, metrics = output.loss, dict(output.metrics)
        # The supervised cold start has no sampling policy to preserve (its datums carry
        # sampler log-probs of 0) and logs no displacement: both are the policy losses'.
        policy = getattr(loss_fn, "name", "") != "cross_entropy"
        if self.llds_coef > 0 and policy:
            units = action_segments if self.llds_gate == "action" else response_segments
            term, llds_metrics = llds_penalty(
                logprobs_T,
                inputs.sampler_logprobs_T,
                inputs.advantages_T,
                units(trained_BT),
                self.llds_coef,
            )
            loss = loss + term
            metrics.update(llds_metrics)
        (loss * loss_scale).backward()
        if self.displacement and policy:
            self._note_positive(datums, logprobs_T.detach(), trained_BT, adv_BT.to(dev))
        mismatch = mismatch_from_logprobs(
            logprobs_T.detach().double().tolist(), inputs.sampler_logprobs_T.double().tolist()
        )
        return float(loss.detach()), metrics, mismatch

    def _batch(self, datums: Sequence[Datum]) -> tuple[torch.Tensor, ...]:
        """``datums`` right-padded: token ids, attention mask, targets and the sampled
        positions on the learner's device, sampler log-probs, advantages and the aggregation
        weights on the CPU
        (float32, or float64 for a float64 model, whose exactness checks need every digit)."""
        width = max(len(d) for d in datums)
        b = len(datums)
        ids_BT = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        targets_BT = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        mask_BT = torch.zeros((b, width), dtype=torch.long)
        real = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        sampler_BT = torch.zeros((b, width), dtype=real)
        adv_BT = torch.zeros((b, width), dtype=real)
        trained_BT = torch.zeros((b, width), dtype=torch.bool)
        weight_BT = torch.zeros((b, width), dtype=real)
        for i, d in enumerate(datums):
            n = len(d)
            ids_BT[i, :n] = torch.tensor(d.input_tokens, dtype=torch.long)
            targets_BT[i, :n] = torch.tensor(d.target_tokens, dtype=torch.long)
            mask_BT[i, :n] = 1
            sampler_BT[i, :n] = torch.tensor(d.sampler_logprobs, dtype=real)
            adv_BT[i, :n] = torch.tensor(d.advantages, dtype=real)
            trained_BT[i, :n] = torch.tensor(d.sampled, dtype=torch.bool)
            weight_BT[i, :n] = d.weight
        dev = self.device
        return (
            ids_BT.to(dev),
            mask_BT.to(dev),
            targets_BT.to(dev),
            trained_BT.to(dev),
            sampler_BT,
            adv_BT,
            weight_BT,
        )

    def _note_positive(
        self,
        datums: Sequence[Datum],
        logprobs_T: torch.Tensor,
        trained_BT: torch.Tensor,
        adv_BT: torch.Tensor,
    ) -> None:
        """Keep the chunk's positive responses (a sampled token with advantage > 0) with
        their summed log-prob under the weights before the update, for :meth:`_displacement`."""
        positive_B = ((adv_BT > 0) & trained_BT).any(dim=1)
        if not bool(positive_B.any()):
            return
        sums_B = torch.zeros(len(datums), dtype=logprobs_T.dtype, device=logprobs_T.device)
        sums_B.index_add_(0, response_segments(trained_BT), logprobs_T)
        for i in positive_B.nonzero()[:, 0].tolist():
            self._positive.append((datums[i], float(sums_B[i])))

    def _displacement(self) -> dict[str, float]:
        """The likelihood displacement of the step just taken: the positive responses noted
        in its forward passes scored again, without gradient, under the new weights
        (:func:`~searchr1.core.step_metrics.displacement_from_logprobs`); {} without any."""
        positive, self._positive = self._positive, []
        if not positive:
            return {}
        datums = [d for d, _ in positive]
        after: list[float] = []
        with torch.no_grad(), scoring_mode(self.model):
            for chunk in self._chunks(datums):
                ids_BT, mask_BT, targets_BT, trained_BT, *_ = self._batch(chunk)
                use_chunked = self._use_chunked(ids_BT, targets_BT, trained_BT)
                tensors = (ids_BT, mask_BT, targets_BT, trained_BT)
                logprobs_T = self._scored(use_chunked, chunk, tensors)
                sums_B = torch.zeros(len(chunk), dtype=logprobs_T.dtype, device=logprobs_T.device)
                sums_B.index_add_(0, response_segments(trained_BT), logprobs_T)
                after += sums_B.tolist()
        return displacement_from_logprobs(
            [
                (d.trajectory_id.rsplit("/", 1)[0], before / n, a / n)
                for (d, before), a in zip(positive, after, strict=True)
                if (n := sum(d.sampled))
            ]
        )

    def _scored(
        self, use_chunked: bool, datums: Sequence[Datum], tensors: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The trained tokens' log-probs under the current weights, shared prompts run once
        where that applies (:meth:`_shared_prefix_logprobs`)."""
        logprobs_T = self._shared_prefix_logprobs(datums, *tensors) if use_chunked else None
        return self._logprobs(use_chunked, *tensors) if logprobs_T is None else logprobs_T

    def _logprobs(
        self,
        use_chunked: bool,
        ids_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        targets_BT: torch.Tensor,
        trained_BT: torch.Tensor,
    ) -> torch.Tensor:
        """The trained tokens' log-probs in row-major order of ``trained_BT``: the chunked
        projection (``logit_chunk`` positions at a time), or the model's own logits over the
        union of trained columns."""
        if use_chunked:
            return chunked_token_logprobs(
                self.model,
                ids_BT,
                mask_BT,
                targets_BT,
                self.temperature,
                trained_BT,
                self.logit_chunk,
            )
        columns_K = trained_BT.any(dim=0).nonzero().squeeze(-1)
        logprobs_BK = trained_token_logprobs(
            self.model, ids_BT, mask_BT, targets_BT, self.temperature, columns_K
        )
        return logprobs_BK[trained_BT[:, columns_K]]

    def pin_reference(self) -> None:
        """The current adapter becomes the KL term's reference policy (after a cold start)."""
        with self.model_lock:
            self.reference.pin()

    def _shared_prefix_logprobs(
        self,
        datums: Sequence[Datum],
        ids_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        targets_BT: torch.Tensor,
        trained_BT: torch.Tensor,
    ) -> torch.Tensor | None:
        """Log-probs with shared prefixes run once, or ``None`` where that does not apply
        (no shared prefix, a model it does not fit, a mismatch on the first check)."""
        if self._shared_ok is False:
            return None
        first = [first_sampled(d.sampled) for d in datums]
        groups = prefix_groups([d.input_tokens for d in datums], first)
        if groups is None:
            return None
        lengths = [len(d) for d in datums]
        prefix_lengths = [first[g[0]] for g in groups]

        def shared() -> torch.Tensor | None:
            return shared_prefix_logprobs(
                self.model,
                ids_BT,
                lengths,
                targets_BT,
                trained_BT,
                groups,
                prefix_lengths,
                self.temperature,
                self.logit_chunk,
            )

        if self._shared_ok is None:
            # Once: the shared forward must give the unshared path's log-probs.
            with torch.no_grad():
                ours = shared()
                theirs = self._logprobs(True, ids_BT, mask_BT, targets_BT, trained_BT)
            diff = float((ours - theirs).abs().max()) if ours is not None and len(ours) else 0.0
            tolerance = 1e-3 if theirs.dtype in (torch.float32, torch.float64) else 0.25
            self._shared_ok = ours is not None and math.isfinite(diff) and diff <= tolerance
            if not self._shared_ok:
                from searchr1.sdk import get_logger

                get_logger().warning(
                    "learner_shared_prefix_off",
                    model=type(causal_lm(self.model)).__name__,
                    max_logprob_difference=diff,
                    message="running each group's shared prompt once did not reproduce the "
                    "model's log-probs (or the model returned no cache: gradient "
                    "checkpointing); every row runs its whole sequence instead",
                )
                return None
        return shared()

    def _use_chunked(
        self, ids_BT: torch.Tensor, targets_BT: torch.Tensor, trained_BT: torch.Tensor
    ) -> bool:
        """Whether this micro-batch takes the chunked path; decides it once, on the first
        row with trained positions, by comparing with the model's own logits
        (:func:`~searchr1.kit.learner.chunked_logprobs.matches_model_logits`)."""
        if self._chunked_ok is not None:
            return self._chunked_ok
        rows = trained_BT.any(dim=1).nonzero().squeeze(-1)
        if len(rows) == 0:
            return True  # nothing trained: either path computes nothing; decide later
        row = int(rows[0])
        positions_K = trained_BT[row].nonzero().squeeze(-1)[:16]
        from searchr1.sdk import get_logger

        name = type(causal_lm(self.model)).__name__
        try:
            ok, diff = matches_model_logits(
                self.model, ids_BT[row], targets_BT[row], positions_K, self.temperature
            )
        except (TypeError, AttributeError, ValueError, NotImplementedError) as e:
            ok, diff = False, math.nan
            reason = f"{type(e).__name__}: {e}"
        else:
            reason = f"max |log-prob difference| {diff:.3g} against the model's own logits"
        if not ok:
            get_logger().warning(
                "learner_logits_fallback",
                model=name,
                reason=reason,
                message=f"{name}: the chunked vocabulary projection does not reproduce "
                "this model's logits (an unknown logit scaling?); the learner computes "
                "B x K x V logits over the union of trained columns instead, which needs "
                "more memory (see chunked_logprobs.py)",
            )
        self._chunked_ok = ok
        return ok

    # ------------------------------------------------------------------ checkpoints

    def save_state(self, path: str, sampler_gen: Any = None) -> None:
        """The adapter, optimizer and step into the folder ``path`` (:mod:`.state`), with the
        sampler's random stream when there is one."""
        import searchr1.kit.learner.state as state

        with self.model_lock:
            adapter, optimizer = self._saved_state()
            state.save_state(
                path,
                self.model,
                self.optimizer,
                self.step,
                sampler_gen,
                adapter=adapter,
                optimizer_state=optimizer,
            )
            self.reference.save(path)

    def _saved_state(self) -> tuple[Mapping[str, torch.Tensor] | None, Mapping[str, Any] | None]:
        """What :meth:`save_state` writes as the adapter and the optimizer state; None, None:
        the model's and the optimizer's own state dicts."""
        return None, None

    def load_state(self, path: str, sampler_gen: Any = None) -> None:
        """What :meth:`save_state` wrote, back into the model and optimizer."""
        with self.model_lock:
            self.step = self._load(path, sampler_gen)
            self.reference.load(path)

    def _load(self, path: str, sampler_gen: Any) -> int:
        """The adapter, optimizer state and random streams of ``path``; returns the step."""
        import searchr1.kit.learner.state as state

        return state.load_state(path, self.model, self.optimizer, sampler_gen)

    # ------------------------------------------------------------------ optimizer

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step over the LoRA parameters with ``adam``'s settings, an optional
        global grad-norm clip, then zeroed gradients. Returns grad_norm, lr and step. Under
        torchrun the gradients are first summed over the ranks (every rank calls this). A
        micro-batch queued since the last step that failed is raised here instead, with no
        step taken."""
        if self._failed is not None:  # a micro-batch of this step failed: no step
            failed, self._failed = self._failed, None
            self._positive.clear()
            self.optimizer.zero_grad(set_to_none=True)
            raise failed
        with self.model_lock:
            grad_norm = self._update(adam)
            displacement = self._displacement()
        out = {"grad_norm": grad_norm, "lr": adam.learning_rate, "step": float(self.step)}
        return {**out, **displacement}

    def _update(self, adam: AdamParams) -> float:
        """The step of :meth:`optim_step` on the accumulated gradients (the caller holds
        ``model_lock``); returns the gradients' total norm before clipping."""
        norm, grad_norm = self._summed_grad_norm()
        clip = adam.grad_clip_norm
        if norm is not None and clip is not None and clip > 0 and grad_norm > clip:
            torch.nn.utils.clip_grads_with_norm_(self.params, clip, norm)
        for group in self.optimizer.param_groups:
            group["lr"] = adam.learning_rate
            group["betas"] = (adam.beta1, adam.beta2)
            group["eps"] = adam.eps
            group["weight_decay"] = adam.weight_decay
        if norm is not None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return grad_norm

    def _summed_grad_norm(self) -> tuple[torch.Tensor | None, float]:
        """Sum the gradients over the ranks (a collective under torchrun); their total norm,
        as the tensor clipping scales by and as a number (None, 0: no gradients)."""
        from searchr1.sdk import all_reduce_grads

        all_reduce_grads(self.params)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return None, 0.0
        norm = torch.nn.utils.get_total_norm(grads)
        return norm, float(norm)


def merge_chunks(
    parts: Sequence[tuple[float, Mapping[str, float], Mapping[str, float]]], datums: int
) -> ForwardBackwardResult:
    """One micro-batch's result from its chunks' (loss, loss metrics, mismatch metrics):
    metrics merged as the loop merges micro-batches (:func:`merge_train_metrics`)."""
    total_loss = sum(loss for loss, _, _ in parts)
    out = merge_train_metrics([{**metrics, **mismatch} for _, metrics, mismatch in parts])
    out["datums"] = float(datums)
    out["loss"] = total_loss
    return ForwardBackwardResult(loss=total_loss, metrics=out)


def _use_device(device: torch.device) -> None:
    """The worker thread's current CUDA device is the learner's (it is per thread: a
    torchrun rank's collectives run on its own GPU)."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
