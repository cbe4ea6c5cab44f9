"""Batched, KV-cached sampling across every request in flight.

The rollout calls :meth:`BatchedSampler.sample` from dozens of asyncio tasks at once (the
first turn of each question with ``num_samples = group_size``, later turns with
``num_samples = 1`` per trajectory). Each call only queues a request and awaits a future;
a single worker thread takes **everything pending** and runs one batched generation over it,
so the event loop keeps serving search I/O meanwhile.

One batch: the distinct prompts are left-padded and prefilled once (a prompt with
``num_samples = n`` is prefilled once and its KV cache copied to its n rows), then every row
decodes one token per step with the shared KV cache. Position ids count real tokens only, so
left padding changes nothing. A request is answered as soon as all its rows have stopped
(its trajectory can search while the others decode); stopped rows leave the batch and the
cache. Requests that arrive while a batch decodes join it between two steps (their prompts
are prefilled and their cache rows appended, see :mod:`.kv_cache`), up to
``max_batch_rows`` rows; the rest wait for the next batch.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from searchr1.core.types import SampledSequence, SamplingParams, StopReason
from searchr1.plugins.local_model import kv_cache
from searchr1.plugins.local_model.next_token import row_generator, sample_next


@dataclass
class SamplerStats:
    """Counters a test or a log line can read: how requests were batched."""

    batches: int = 0  # batched generations run
    forward_calls: int = 0  # model forward passes (1 prefill + 1 per decoding step per batch)
    requests: int = 0  # sample() calls served
    rows: int = 0  # sequences generated
    generated_tokens: int = 0
    max_batch_rows: int = 0  # the largest batch seen
    admitted_requests: int = 0  # requests that joined a batch already decoding


@dataclass
class _Request:
    prompt: list[int]
    num_samples: int
    params: SamplingParams
    future: asyncio.Future[list[SampledSequence]]
    loop: asyncio.AbstractEventLoop


@dataclass(eq=False)
class _Job:
    """A request being served: its samples fill ``results`` as its rows stop."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    request: _Request | None = None  # None when called through generate()
    results: list[SampledSequence | None] = field(default_factory=list)
    remaining: int = 0
    delivered: bool = False

    def __post_init__(self) -> None:
        self.results = [None] * self.num_samples
        self.remaining = self.num_samples

    @classmethod
    def of(cls, request: _Request) -> _Job:
        return cls(request.prompt, request.num_samples, request.params, request)


@dataclass(eq=False)
class _Row:
    """One sequence being generated."""

    job: _Job
    index: int  # which of the job's samples
    max_new: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    window: int  # tokens decoded to look for a stop string
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reason: StopReason | None = None


@dataclass(eq=False)
class _Batch:
    """The running batch: one entry per active row in every per-row tensor (R) and in the
    KV cache; ``mask_RL`` is as wide as the cache."""

    rows: list[_Row]
    cache: Any
    logits_RV: torch.Tensor
    mask_RL: torch.Tensor
    next_pos_R: torch.Tensor
    temperature_R: torch.Tensor
    top_p_R: torch.Tensor

    def select(self, keep: list[int], tokens_R: torch.Tensor, trim: bool) -> torch.Tensor:
        """Keep only rows ``keep`` (returns their tokens); with ``trim``, also cut leading
        columns that every remaining row masks."""
        self.rows = [self.rows[j] for j in keep]
        if not keep:
            return tokens_R[:0]
        idx = torch.tensor(keep, dtype=torch.long, device=tokens_R.device)
        self.cache.batch_select_indices(idx)
        self.mask_RL, self.next_pos_R = self.mask_RL[idx], self.next_pos_R[idx]
        self.temperature_R, self.top_p_R = self.temperature_R[idx], self.top_p_R[idx]
        if trim:
            lead = int(self.mask_RL.any(dim=0).long().argmax())
            if lead > 0:
                kv_cache.trim_left(self.cache, lead)
                self.mask_RL = self.mask_RL[:, lead:]
        return tokens_R[idx]

    def merge(self, other: _Batch) -> _Batch:
        """Append ``other``'s rows, left-padding the narrower of the two to a common width."""
        if not self.rows:
            return other
        a, b = self.mask_RL.shape[1], other.mask_RL.shape[1]
        if a < b:
            kv_cache.pad_left(self.cache, b - a)
            self.mask_RL = torch.cat(
                [self.mask_RL.new_zeros((len(self.rows), b - a)), self.mask_RL], 1
            )
        elif b < a:
            kv_cache.pad_left(other.cache, a - b)
            other.mask_RL = torch.cat(
                [other.mask_RL.new_zeros((len(other.rows), a - b)), other.mask_RL], 1
            )
        kv_cache.append_rows(self.cache, other.cache)
        self.rows = self.rows + other.rows
        self.logits_RV = torch.cat([self.logits_RV, other.logits_RV])
        self.mask_RL = torch.cat([self.mask_RL, other.mask_RL])
        self.next_pos_R = torch.cat([self.next_pos_R, other.next_pos_R])
        self.temperature_R = torch.cat([self.temperature_R, other.temperature_R])
        self.top_p_R = torch.cat([self.top_p_R, other.top_p_R])
        return self


class BatchedSampler:
    """Owns the sampling worker thread of one :class:`LocalModelProvider`.

    ``model_lock`` is shared with the learner: a batch never runs while gradients are being
    computed or weights updated, and the first batch after ``optim_step`` sees the new
    weights (the model object is shared and every batch builds a fresh KV cache).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: torch.device,
        model_lock: threading.Lock,
        context_length: int,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        vocab_size: int,
        max_batch_rows: int = 256,
        batch_wait_s: float = 0.005,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.model_lock = model_lock
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.max_batch_rows = max_batch_rows
        self.batch_wait_s = batch_wait_s
        self.stats = SamplerStats()
        self._cache_kw = _cache_kwarg(model)
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)
        self._queue: queue.Queue[list[_Request] | None] = queue.Queue()
        self._pending: list[_Request] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        # Worker-thread state: requests taken off the queue but not yet in a batch.
        self._backlog: list[_Request] = []
        self._admitted: list[_Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ asyncio side

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """Queue one request and wait for its batch; errors in the request raise here."""
        prompt = self._check_request(prompt_tokens, num_samples, params)
        if self._closed:
            raise RuntimeError("the local model provider is closed")
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        request = _Request(prompt, num_samples, params, loop.create_future(), loop)
        with self._pending_lock:
            self._pending.append(request)
            schedule = not self._flush_scheduled
            self._flush_scheduled = True
        if schedule:
            # Runs after every task that is ready now has had its turn, so all the requests
            # that a gather() of many rollouts makes in one loop iteration share a batch.
            loop.call_soon(self._flush)
        return await request.future

    def _flush(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._flush_scheduled = False
        if batch:
            self._queue.put(batch)

    def _check_request(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[int]:
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
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"sample(): prompt_tokens holds ids outside the vocabulary "
                f"(size {self.vocab_size}): {bad[:5]}"
            )
        if len(prompt) >= self.context_length:
            raise ValueError(
                f"sample(): the prompt has {len(prompt)} tokens, the model's context is "
                f"{self.context_length}; nothing can be generated"
            )
        return prompt

    # ------------------------------------------------------------------ worker side

    def _ensure_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._worker, name="searchr1-sampler", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the worker after the batch it is running (called by the provider's close)."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def _worker(self) -> None:
        while True:
            if not self._backlog and not self._accept(self._queue.get()):
                return
            self._gather_more()
            jobs = [_Job.of(r) for r in self._take(self.max_batch_rows)]
            try:
                self._run(jobs, admit=self._admit)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                for job in jobs + self._admitted:
                    if job.request is not None and not job.delivered:
                        job.delivered = True
                        _resolve(job.request, exc=exc)
            self._admitted = []
            if self._stopping and not self._backlog:
                return

    def _gather_more(self) -> None:
        """Move what is already queued into the backlog, waiting up to ``batch_wait_s`` for
        stragglers (turns whose searches finish a moment apart)."""
        deadline = time.monotonic() + self.batch_wait_s
        while not self._stopping and self._backlog_rows() < self.max_batch_rows:
            timeout = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                return
            if not self._accept(item):
                return

    def _accept(self, item: list[_Request] | None) -> bool:
        """Move one queue item into the backlog; the shutdown sentinel (None) instead sets
        ``_stopping`` and returns False."""
        if item is None:
            self._stopping = True
            return False
        self._backlog.extend(item)
        return True

    def _backlog_rows(self) -> int:
        return sum(r.num_samples for r in self._backlog)

    def _take(self, capacity: int) -> list[_Request]:
        """Whole requests from the backlog, in arrival order, up to ``capacity`` rows (the
        first one always, so a request larger than the cap still runs, alone)."""
        taken: list[_Request] = []
        rows = 0
        while self._backlog and (
            not taken
            and capacity == self.max_batch_rows
            or rows + self._backlog[0].num_samples <= capacity
        ):
            r = self._backlog.pop(0)
            taken.append(r)
            rows += r.num_samples
        return taken

    def _admit(self, capacity: int) -> list[_Job]:
        """Called by a running batch between decoding steps: requests queued since it began
        join it now instead of waiting for its longest row to finish."""
        while not self._stopping:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not self._accept(item):
                break
        jobs = [_Job.of(r) for r in self._take(capacity)] if capacity > 0 else []
        self._admitted.extend(jobs)
        return jobs

    # ------------------------------------------------------------------ generation

    def generate(
        self, requests: Sequence[tuple[Sequence[int], int, SamplingParams]]
    ) -> list[list[SampledSequence]]:
        """Run one batched generation over ``(prompt, num_samples, params)`` requests and
        return each request's samples (tests and benchmarks call this directly)."""
        jobs = [_Job(list(p), n, params) for p, n, params in requests]
        self._run(jobs)
        return [list(job.results) for job in jobs]  # type: ignore[arg-type]

    def _run(self, jobs: list[_Job], admit: Callable[[int], list[_Job]] | None = None) -> None:
        """Decode ``jobs`` (and whatever ``admit`` adds between steps) to the end. Each job is
        delivered as soon as all its rows have stopped."""
        with self.model_lock, torch.inference_mode():
            self.model.eval()
            batch = self._prefill(jobs)
            self.stats.batches += 1
            editable = kv_cache.editable(batch.cache)
            while batch.rows:
                uniform_R = self._uniform(batch.rows).to(self.device)
                tokens_R, logprobs_R = sample_next(
                    batch.logits_RV, batch.temperature_R, batch.top_p_R, uniform_R
                )
                keep: list[int] = []
                for j, (token, logprob) in enumerate(
                    zip(tokens_R.tolist(), logprobs_R.tolist(), strict=True)
                ):
                    row = batch.rows[j]
                    row.tokens.append(token)
                    row.logprobs.append(logprob)
                    row.reason = self._stop_reason(row)
                    if row.reason is None:
                        keep.append(j)
                    else:
                        self._finish_row(row)
                if len(keep) != len(batch.rows):
                    tokens_R = batch.select(keep, tokens_R, trim=editable)
                if batch.rows:
                    self._decode_step(batch, tokens_R)
                if admit is not None and editable:
                    new_jobs = admit(self.max_batch_rows - len(batch.rows))
                    if new_jobs:
                        self.stats.admitted_requests += len(new_jobs)
                        batch = batch.merge(self._prefill(new_jobs))
                        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(batch.rows))

    def _prefill(self, jobs: list[_Job]) -> _Batch:
        """Prefill each job's prompt once (left-padded; positions count real tokens only) and
        copy its KV cache to the job's ``num_samples`` rows."""
        dev = self.device
        rows: list[_Row] = []
        owner: list[int] = []
        for i, job in enumerate(jobs):
            params = job.params
            stop_ids = frozenset(params.stop_token_ids) | self.eos_token_ids
            window = max((len(s.encode("utf-8")) for s in params.stop_strings), default=0) + 2
            max_new = min(params.max_tokens, self.context_length - len(job.prompt))
            for k in range(job.num_samples):
                gen = row_generator(params.seed, k) if params.seed is not None else None
                rows.append(_Row(job, k, max_new, stop_ids, params.stop_strings, window, gen))
                owner.append(i)
        lens = [len(job.prompt) for job in jobs]
        width = max(lens)
        ids_PL = torch.full((len(jobs), width), self.pad_token_id, dtype=torch.long)
        mask_PL = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, job in enumerate(jobs):
            ids_PL[i, width - lens[i] :] = torch.tensor(job.prompt, dtype=torch.long)
            mask_PL[i, width - lens[i] :] = 1
        pos_PL = (mask_PL.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids_PL.to(dev),
            attention_mask=mask_PL.to(dev),
            position_ids=pos_PL.to(dev),
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats.forward_calls += 1
        self.stats.requests += len(jobs)
        self.stats.rows += len(rows)
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(rows))
        cache = _output_cache(out)
        owner_R = torch.tensor(owner, dtype=torch.long, device=dev)
        if len(rows) != len(jobs):
            cache.batch_select_indices(owner_R)
        return _Batch(
            rows=rows,
            cache=cache,
            logits_RV=out.logits[:, -1, :][owner_R],
            mask_RL=mask_PL.to(dev)[owner_R],
            next_pos_R=torch.tensor(lens, dtype=torch.long, device=dev)[owner_R],
            temperature_R=torch.tensor(
                [r.job.params.temperature for r in rows], dtype=torch.float32, device=dev
            ),
            top_p_R=torch.tensor(
                [r.job.params.top_p for r in rows], dtype=torch.float32, device=dev
            ),
        )

    def _decode_step(self, batch: _Batch, tokens_R: torch.Tensor) -> None:
        """Feed each row's newest token; the logits of the next one replace ``logits_RV``."""
        batch.mask_RL = torch.cat([batch.mask_RL, batch.mask_RL.new_ones((len(batch.rows), 1))], 1)
        out = self.model(
            input_ids=tokens_R[:, None],
            attention_mask=batch.mask_RL,
            position_ids=batch.next_pos_R[:, None],
            use_cache=True,
            **{self._cache_kw: batch.cache},
        )
        self.stats.forward_calls += 1
        batch.cache = _output_cache(out)
        batch.next_pos_R = batch.next_pos_R + 1
        batch.logits_RV = out.logits[:, -1, :]

    def _finish_row(self, row: _Row) -> None:
        job = row.job
        assert row.reason is not None
        job.results[row.index] = SampledSequence(tuple(row.tokens), tuple(row.logprobs), row.reason)
        job.remaining -= 1
        self.stats.generated_tokens += len(row.tokens)
        if job.remaining == 0 and job.request is not None and not job.delivered:
            job.delivered = True
            _resolve(job.request, result=list(job.results))  # type: ignore[arg-type]

    def _uniform(self, rows: list[_Row]) -> torch.Tensor:
        """One U[0, 1) draw per row: seeded rows from their own stream, the rest from the
        provider's stream (so a seeded request does not depend on its batch mates)."""
        shared = torch.rand(len(rows), generator=self._generator)
        for k, row in enumerate(rows):
            if row.generator is not None:
                shared[k] = torch.rand(1, generator=row.generator)[0]
        return shared

    def _stop_reason(self, row: _Row) -> StopReason | None:
        """``stop`` when the newest token is a stop id or completes a stop string (checked on
        the decoded text of the last few generated tokens, which covers any string that the
        newest token can complete), ``length`` at the row's token budget."""
        if row.tokens[-1] in row.stop_ids:
            return "stop"
        if row.stop_strings:
            tail = self.tokenizer.decode(row.tokens[-row.window :], skip_special_tokens=False)
            if any(s in tail for s in row.stop_strings):
                return "stop"
        if len(row.tokens) >= row.max_new:
            return "length"
        return None


def _resolve(
    request: _Request,
    result: list[SampledSequence] | None = None,
    exc: BaseException | None = None,
) -> None:
    def deliver() -> None:
        if request.future.done():  # the caller was cancelled
            return
        if exc is not None:
            request.future.set_exception(exc)
        else:
            request.future.set_result(result)  # type: ignore[arg-type]

    try:
        request.loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the caller's event loop is closed
        pass


def _cache_kwarg(model: Any) -> str:
    """The name of the KV-cache argument: transformers 5.x renamed ``past_key_values`` to
    ``cache`` (the old name warns, then goes); older releases only know the old one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _output_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
