"""One running batch of the sampler: its rows, its cache, chunked prefill and decode steps.

:class:`~searchr1.plugins.local_model.sampler.BatchedSampler` owns the queue and runs the
decode loop, :mod:`.admission` decides which requests run together; this module does the
tensor work for one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import searchr1.plugins.local_model.kv_cache as kv_cache
from searchr1.kit.learner.chunked_logprobs import output_cache
from searchr1.plugins.local_model.next_token import row_generator
from searchr1.sdk import SampledSequence, SamplingParams, StopReason

_DRAWS = 64  # uniforms drawn at once from a seeded row's own stream


@dataclass(eq=False)
class Job:
    """A request being served: its samples fill ``results`` as its rows stop."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    request: Any = None  # the sampler's queued request; None when called through generate()
    results: list[SampledSequence | None] = field(default_factory=list)
    remaining: int = 0
    delivered: bool = False
    past: Any = None  # a retained cache (reuse.Retained) this job continues, set at prefill

    def __post_init__(self) -> None:
        self.results = [None] * self.num_samples
        self.remaining = self.num_samples

    def max_new(self, context_length: int) -> int:
        return min(self.params.max_tokens, context_length - len(self.prompt))


@dataclass(eq=False)
class Row:
    """One sequence being generated."""

    job: Job
    index: int  # which of the job's samples
    max_new: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    window: int  # tokens decoded to look for a stop string
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reason: StopReason | None = None
    draws: list[float] = field(default_factory=list)

    def uniform(self) -> float:
        """The next U[0, 1) draw of this row's own stream (drawn in blocks: one call to the
        generator per ``_DRAWS`` tokens instead of one per token)."""
        if not self.draws:
            assert self.generator is not None
            self.draws = torch.rand(_DRAWS, generator=self.generator).tolist()[::-1]
        return self.draws.pop()


@dataclass(eq=False)
class Batch:
    """The running batch: one entry per active row in every per-row tensor (R) and in the
    cache; ``mask_RL`` is as wide as the cache's attention layers."""

    rows: list[Row]
    cache: Any
    logits_RV: torch.Tensor
    mask_RL: torch.Tensor
    next_pos_R: torch.Tensor
    temperature_R: torch.Tensor
    top_p_R: torch.Tensor

    def tokens(self) -> int:
        """Cache positions held now, padding included (rows x width)."""
        return len(self.rows) * int(self.mask_RL.shape[1])

    def projected(self) -> tuple[int, int]:
        """(rows, widest end column) if every row ran to its token budget."""
        width = int(self.mask_RL.shape[1])
        left = max((r.max_new - len(r.tokens) for r in self.rows), default=0)
        return len(self.rows), width + left

    def select(self, keep: list[int], tokens_R: torch.Tensor, trim: bool) -> torch.Tensor:
        """Keep only rows ``keep`` (returns their tokens); with ``trim``, also cut leading
        columns that every remaining row masks."""
        self.rows = [self.rows[j] for j in keep]
        if not keep:
            return tokens_R[:0]
        idx = torch.tensor(keep, dtype=torch.long, device=tokens_R.device)
        kv_cache.select_rows(self.cache, idx)
        self.logits_RV = self.logits_RV[idx]
        self.mask_RL, self.next_pos_R = self.mask_RL[idx], self.next_pos_R[idx]
        self.temperature_R, self.top_p_R = self.temperature_R[idx], self.top_p_R[idx]
        if trim:
            lead = int(self.mask_RL.any(dim=0).long().argmax())
            if lead > 0:
                kv_cache.trim_left(self.cache, lead)
                self.mask_RL = self.mask_RL[:, lead:]
        return tokens_R[idx]

    def merge(self, other: Batch) -> Batch:
        """Append ``other``'s rows, left-padding the narrower of the two to a common width."""
        if not self.rows:
            return other
        a, b = self.mask_RL.shape[1], other.mask_RL.shape[1]
        if a < b:
            kv_cache.pad_left(self.cache, b - a)
            self.mask_RL = _pad_mask(self.mask_RL, b - a)
        elif b < a:
            kv_cache.pad_left(other.cache, a - b)
            other.mask_RL = _pad_mask(other.mask_RL, a - b)
        kv_cache.append_rows(self.cache, other.cache)
        self.rows = self.rows + other.rows
        self.logits_RV = torch.cat([self.logits_RV, other.logits_RV])
        self.mask_RL = torch.cat([self.mask_RL, other.mask_RL])
        self.next_pos_R = torch.cat([self.next_pos_R, other.next_pos_R])
        self.temperature_R = torch.cat([self.temperature_R, other.temperature_R])
        self.top_p_R = torch.cat([self.top_p_R, other.top_p_R])
        return self


def _pad_mask(mask_RL: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.cat([mask_RL.new_zeros((mask_RL.shape[0], columns)), mask_RL], 1)


@dataclass(eq=False, kw_only=True)
class Forward:
    """Model calls of the sampler: chunked prefill of a group of jobs, one decode step.

    ``count`` is called once per model forward (the sampler's statistics)."""

    model: Any
    device: torch.device
    pad_token_id: int
    eos_token_ids: frozenset[int]
    context_length: int
    cache_kw: str
    prefill_chunk_tokens: int
    count: Callable[[], None]
    #: a sharded model's forwards in step with the other ranks' (fsdp.Lockstep), or None
    lockstep: Any = None

    def _model(self, **kwargs: Any) -> Any:
        if self.lockstep is not None:
            self.lockstep.before_forward()
        return self.model(**kwargs)

    def prefill(self, jobs: list[Job]) -> Batch:
        """A batch over ``jobs``' rows, every prompt (or its new tokens) prefilled."""
        fresh = [j for j in jobs if j.past is None]
        parts = [self._prefill_group(fresh)] if fresh else []
        groups: dict[int, list[Job]] = {}
        for job in jobs:
            if job.past is not None:
                key = len(job.prompt) - job.past.length if job.past.stateful else 0
                groups.setdefault(key, []).append(job)
        parts.extend(self._prefill_group(group) for group in groups.values())
        batch = parts[0]
        for part in parts[1:]:
            batch = batch.merge(part)
        return batch

    def _rows(self, jobs: list[Job]) -> tuple[list[Row], list[int]]:
        """One row per sample of each job, and the index of the job each row belongs to."""
        rows: list[Row] = []
        owner: list[int] = []
        for i, job in enumerate(jobs):
            params = job.params
            stop_ids = frozenset(params.stop_token_ids) | self.eos_token_ids
            window = max((len(s.encode("utf-8")) for s in params.stop_strings), default=0) + 2
            max_new = job.max_new(self.context_length)
            for k in range(job.num_samples):
                gen = row_generator(params.seed, k) if params.seed is not None else None
                rows.append(Row(job, k, max_new, stop_ids, params.stop_strings, window, gen))
                owner.append(i)
        return rows, owner

    def _prefill_group(self, jobs: list[Job]) -> Batch:
        """Prefill the prompts of ``jobs`` (each after its retained cache, if any) in chunks,
        and return the batch of their rows ready to decode."""
        dev = self.device
        rows, owner = self._rows(jobs)
        cache, mask_past, start = self._past(jobs)
        new = [job.prompt[job.past.length :] if job.past else job.prompt for job in jobs]
        lens = [len(t) for t in new]
        width = max(lens)
        ids_PL = torch.full((len(jobs), width), self.pad_token_id, dtype=torch.long)
        mask_PL = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, tokens in enumerate(new):
            ids_PL[i, width - lens[i] :] = torch.tensor(tokens, dtype=torch.long)
            mask_PL[i, width - lens[i] :] = 1
        pos_PL = (start[:, None] + mask_PL.cumsum(-1) - 1).clamp(min=0)
        ids_PL, mask_PL, pos_PL = ids_PL.to(dev), mask_PL.to(dev), pos_PL.to(dev)
        mask_PL = torch.cat([mask_past.to(dev), mask_PL], 1)
        past_w = mask_past.shape[1]
        # Chunks of at least 16 columns: a one-column forward is taken for a decode step,
        # for which transformers drops the padding mask of linear-attention layers.
        step = max(16, self.prefill_chunk_tokens // max(1, len(jobs)))
        out = None
        for c0 in range(0, width, step):
            c1 = min(width, c0 + step)
            kwargs = {self.cache_kw: cache} if cache is not None else {}
            out = self._model(
                input_ids=ids_PL[:, c0:c1],
                attention_mask=mask_PL[:, : past_w + c1],
                position_ids=pos_PL[:, c0:c1],
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
            self.count()
            cache = output_cache(out)
        assert out is not None
        owner_R = torch.tensor(owner, dtype=torch.long, device=dev)
        if len(rows) != len(jobs):
            kv_cache.select_rows(cache, owner_R)
        return Batch(
            rows=rows,
            cache=cache,
            logits_RV=out.logits[:, -1, :][owner_R],
            mask_RL=mask_PL[owner_R],
            next_pos_R=(start.to(dev) + torch.tensor(lens, device=dev))[owner_R],
            # float64: a float64 model's sampler divides by exactly the learner's temperature.
            temperature_R=torch.tensor(
                [r.job.params.temperature for r in rows], dtype=torch.float64, device=dev
            ),
            top_p_R=torch.tensor(
                [r.job.params.top_p for r in rows], dtype=torch.float32, device=dev
            ),
        )

    def _past(self, jobs: list[Job]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The retained caches of ``jobs`` stacked into one (None for fresh prompts), their
        masks left-padded to a common width, and each job's next position."""
        if jobs[0].past is None:
            zeros = torch.zeros(len(jobs), dtype=torch.long)
            return None, torch.zeros((len(jobs), 0), dtype=torch.long), zeros
        pasts = [job.past for job in jobs]
        w = max(p.mask_L.shape[0] for p in pasts)
        cache = None
        masks = []
        for p in pasts:
            kv_cache.pad_left(p.cache, w - p.mask_L.shape[0])
            masks.append(torch.cat([p.mask_L.new_zeros(w - p.mask_L.shape[0]), p.mask_L]))
            if cache is None:
                cache = p.cache
            else:
                kv_cache.append_rows(cache, p.cache)
        start = torch.tensor([p.next_pos for p in pasts], dtype=torch.long)
        return cache, torch.stack(masks).cpu(), start

    def decode_step(self, batch: Batch, tokens_R: torch.Tensor) -> None:
        """Feed each row's newest token; the logits of the next one replace ``logits_RV``."""
        batch.mask_RL = torch.cat([batch.mask_RL, batch.mask_RL.new_ones((len(batch.rows), 1))], 1)
        out = self._model(
            input_ids=tokens_R[:, None],
            attention_mask=batch.mask_RL,
            position_ids=batch.next_pos_R[:, None],
            use_cache=True,
            **{self.cache_kw: batch.cache},
        )
        self.count()
        batch.cache = output_cache(out)
        batch.next_pos_R = batch.next_pos_R + 1
        batch.logits_RV = out.logits[:, -1, :]
