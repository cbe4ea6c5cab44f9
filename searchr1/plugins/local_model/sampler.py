"""Batched, KV-cached sampling across every request in flight.

The rollout calls :meth:`BatchedSampler.sample` from dozens of asyncio tasks at once (the
first turn of each question with ``num_samples = group_size``, later turns with
``num_samples = 1`` per trajectory). Each call only queues a request and awaits a future;
a single worker thread takes what is pending and runs one batched generation over it
(:mod:`.generation` does the tensor work), so the event loop keeps serving search I/O.
:mod:`.sample_request` checks a call and carries it across the thread boundary.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import searchr1.plugins.local_model.kv_cache as kv_cache
from searchr1.kit.learner.chunked_logprobs import cache_kwarg
from searchr1.plugins.local_model.admission import take_requests
from searchr1.plugins.local_model.generation import Batch, Forward, Job, Row
from searchr1.plugins.local_model.next_token import sample_next
from searchr1.plugins.local_model.reuse import RetainedCaches, retain_row
from searchr1.plugins.local_model.sample_request import SampleRequest, check_request, resolve
from searchr1.sdk import SampledSequence, SamplingParams, StopReason

if TYPE_CHECKING:
    from searchr1.kit.learner.fsdp import Lockstep


@dataclass
class SamplerStats:
    """Counters a test or a log line can read: how requests were batched, what memory held."""

    batches: int = 0  # batched generations run
    forward_calls: int = 0  # model forward passes (prefill chunks + 1 per decoding step)
    requests: int = 0  # sample() calls served
    rows: int = 0  # sequences generated
    prefill_tokens: int = 0  # prompt tokens fed to the model (new tokens of a continuation)
    reused_tokens: int = 0  # prompt tokens a retained cache spared from prefill
    max_batch_rows: int = 0  # the largest batch seen
    admitted_requests: int = 0  # requests that joined a batch already decoding
    peak_cache_tokens: int = 0  # most cache positions (rows x width) held, retained included
    peak_cache_bytes: int = 0  # measured cache bytes at that time (when measure_bytes is on)


class BatchedSampler:
    """Owns the sampling worker thread of one :class:`LocalModelProvider`.

    ``model_lock`` is shared with the learner: a batch never runs while gradients are being
    computed or weights updated, and the first batch after ``optim_step`` sees the new
    weights (the model object is shared; the provider drops every retained cache before the
    weights change, so each batch after builds its caches afresh).
    """

    #: lockstep: seconds a closed sampler's session waits, with no rank working, for the
    #: other ranks to close theirs before it leaves alone (they close together within
    #: moments: the train loop closes the model on every rank at the same point)
    LEAVE_IDLE_S = 5.0

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
        max_batch_tokens: int = 1 << 20,
        row_tokens: int = 0,
        prefill_chunk_tokens: int = 2048,
        reuse: bool = True,
        batch_wait_s: float = 0.005,
        seed: int = 0,
        may_join: Callable[[], bool] | None = None,
        lockstep: Lockstep | None = None,
    ) -> None:
        """``lockstep``: the model is sharded (FSDP2) and each forward runs in step with the
        other ranks' (:class:`~searchr1.kit.learner.fsdp.Lockstep`): :meth:`sample`
        serves inside a session (:meth:`begin_session`), :meth:`generate` outside one,
        called by every rank."""
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.model_lock = model_lock
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.row_tokens = row_tokens  # per-row recurrent state, in tokens (budget.py)
        self.batch_wait_s = batch_wait_s
        # asked by a running batch before it admits queued requests; the provider says no
        # once the sampler's weights moved on (pipelined steps), so no batch mixes versions
        self.may_join = may_join
        self.stats = SamplerStats()
        self.measure_bytes = False  # measure the cache's bytes after each forward (tests)
        self.retained = RetainedCaches(row_tokens)
        self.reuse = reuse
        self.forward = Forward(
            model=model,
            device=device,
            pad_token_id=pad_token_id,
            eos_token_ids=self.eos_token_ids,
            context_length=context_length,
            cache_kw=cache_kwarg(model),
            prefill_chunk_tokens=prefill_chunk_tokens,
            count=self._count_forward,
            lockstep=lockstep,
        )
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)
        self._init_worker_state()

    def _init_worker_state(self) -> None:
        """The queues and flags shared by the asyncio side and the worker thread."""
        self._queue: queue.Queue[list[SampleRequest] | None] = queue.Queue()
        self._pending: list[SampleRequest] = []
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        # Worker-thread state: requests taken off the queue but not yet in a batch.
        self._backlog: list[SampleRequest] = []
        self._admitted: list[Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False
        # Lockstep: True starts a session in the worker, False ends the worker; the session
        # sets ``_session_over`` when it ends, with ``_failure`` when it failed
        self._sessions: queue.Queue[bool] = queue.Queue()
        self._session_over = threading.Event()
        self._session_over.set()
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ asyncio side

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        """Queue one request and wait for its batch; errors in the request raise here."""
        prompt = check_request(
            prompt_tokens,
            num_samples,
            params,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
        )
        if self._closed:
            raise RuntimeError("the local model provider is closed")
        lockstep = self.forward.lockstep
        if lockstep is not None:
            if self._failure is not None:
                raise RuntimeError(f"lockstep sampling stopped: {self._failure}") from self._failure
            if not lockstep.open:
                # only a session's worker joins the other ranks' forwards
                raise RuntimeError("a lockstep sampler samples inside a session only")
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        request = SampleRequest(prompt, num_samples, params, loop.create_future(), loop)
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

    # ------------------------------------------------------------------ worker side

    def _ensure_worker(self) -> None:
        if self._thread is None:
            target = self._worker if self.forward.lockstep is None else self._lockstep_worker
            self._thread = threading.Thread(target=target, name="searchr1-sampler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the worker after the batch it is running (called by the provider's close).
        A lockstep session first ends: on every rank together, this rank joining the
        others' forwards meanwhile; or, once no rank has worked for :attr:`LEAVE_IDLE_S`
        (the others are not closing: this one leaves on an error), on this rank alone, whose
        peers' next agreement then fails as this process exits (a peer that is gone ends it
        too, by the collective's failure)."""
        self._closed = True
        if self._thread is not None:
            if self.forward.lockstep is not None:
                self._end_session(timeout=60, check=False)
                self._sessions.put(False)
            else:
                self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    # ------------------------------------------------------------------ lockstep sessions

    def begin_session(self) -> None:
        """Lockstep: serve :meth:`sample` from now on, the worker joining every forward of
        the other ranks' sessions until :meth:`outside_session` (every rank calls both at
        the same points: the session ends on all together). Nothing without lockstep."""
        lockstep = self.forward.lockstep
        if lockstep is None or lockstep.open or self._closed:
            return
        self._ensure_worker()
        self._session_over.clear()
        lockstep.open = True
        self._sessions.put(True)

    @contextmanager
    def outside_session(self) -> Iterator[None]:
        """Lockstep: end the session (waiting, while other ranks still sample, until every
        rank ended it), run the body (the learner: its collectives use the model's group
        too), then begin the next one. Nothing else without lockstep."""
        lockstep = self.forward.lockstep
        if lockstep is None or not lockstep.open:
            yield
            return
        self._end_session()
        yield
        self.begin_session()

    def _end_session(self, timeout: float | None = None, check: bool = True) -> None:
        """Close this rank's session and wait until it ended; ``check``: raise its failure."""
        lockstep = self.forward.lockstep
        assert lockstep is not None
        lockstep.open = False
        self._session_over.wait(timeout)
        if check and self._failure is not None:
            raise RuntimeError(f"lockstep sampling stopped: {self._failure}") from self._failure

    def _lockstep_worker(self) -> None:
        while self._sessions.get():
            try:
                self._session()
            except BaseException as exc:  # noqa: BLE001 - kept, handed to every caller
                self._failure = exc
                self.retained.clear()
                self._take_queued()
                for request in self._backlog:
                    resolve(request, exc=exc)
                self._backlog = []
            finally:
                self._session_over.set()

    def _session(self) -> None:
        """One lockstep session: each round this rank runs a batch of its own (every
        forward of it agreed with the other ranks), or, without work, agrees and joins a
        working rank's forward with an idle one, waits a moment while some session is still
        open, or ends with every rank when none is (:class:`~.fsdp.Lockstep`)."""
        lockstep = self.forward.lockstep
        assert lockstep is not None
        idle_since: float | None = None  # since when no rank worked, once closed
        while True:
            self._take_queued()
            if self._backlog:
                self._gather_more()
            with self.model_lock:
                taken = self._take(None)
            if taken:
                jobs = [Job(r.prompt, r.num_samples, r.params, r) for r in taken]
                try:
                    self._run(jobs, admit=self._admit)
                except BaseException as exc:
                    for job in jobs + self._admitted:
                        if job.request is not None and not job.delivered:
                            job.delivered = True
                            resolve(job.request, exc=exc)
                    raise  # out of step with the other ranks' forwards: the session fails
                finally:
                    self._admitted = []
                continue
            working, still_open = lockstep.agree(0)
            if working:
                idle_since = None
                with self.model_lock, torch.inference_mode():
                    lockstep.idle_forward()
            elif not still_open:
                return
            else:
                if self._closed:  # this rank's session is over: waiting for the others'
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > self.LEAVE_IDLE_S:
                        return  # they are not closing theirs (this rank ends on an error)
                time.sleep(lockstep.poll_s)

    def _take_queued(self) -> None:
        """Move every queued request into the backlog, without waiting."""
        while True:
            try:
                self._accept(self._queue.get_nowait())
            except queue.Empty:
                return

    def _worker(self) -> None:
        while True:
            if not self._backlog and not self._accept(self._queue.get()):
                return
            self._gather_more()
            with self.model_lock:  # the learner may be clearing the retained caches
                taken = self._take(None)
            jobs = [Job(r.prompt, r.num_samples, r.params, r) for r in taken]
            try:
                if jobs:  # none when every waiting caller was cancelled
                    self._run(jobs, admit=self._admit)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                self.retained.clear()
                for job in jobs + self._admitted:
                    if job.request is not None and not job.delivered:
                        job.delivered = True
                        resolve(job.request, exc=exc)
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

    def _accept(self, item: list[SampleRequest] | None) -> bool:
        """Move one queue item into the backlog; the shutdown sentinel (None) instead sets
        ``_stopping`` and returns False."""
        if item is None:
            self._stopping = True
            return False
        self._backlog.extend(item)
        return True

    def _backlog_rows(self) -> int:
        return sum(r.num_samples for r in self._backlog)

    def _take(self, batch: Batch | None) -> list[SampleRequest]:
        """Requests from the backlog that fit next to ``batch`` (None: a new batch), by the
        rule of :mod:`.admission`; those whose caller stopped waiting are dropped."""
        self._backlog = [r for r in self._backlog if not _abandoned(r)]
        return take_requests(
            self._backlog,
            batch,
            max_batch_rows=self.max_batch_rows,
            max_batch_tokens=self.max_batch_tokens,
            row_tokens=self.row_tokens,
            context_length=self.context_length,
            retained=self.retained,
        )

    def _admit(self, batch: Batch) -> list[Job]:
        """Called by a running batch between decoding steps: requests queued since it began
        join it now (as far as they fit) instead of waiting for its longest row."""
        if self.may_join is not None and not self.may_join():
            return []
        while not self._stopping:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not self._accept(item):
                break
        if not self._backlog:
            return []
        jobs = [Job(r.prompt, r.num_samples, r.params, r) for r in self._take(batch)]
        self._admitted.extend(jobs)
        return jobs

    def forget(self) -> None:
        """Drop every retained cache (the provider calls this before the weights change)."""
        with self.model_lock:
            self.retained.clear()

    # ------------------------------------------------------------------ generation

    def generate(
        self, requests: Sequence[tuple[Sequence[int], int, SamplingParams]]
    ) -> list[list[SampledSequence]]:
        """Run one batched generation over ``(prompt, num_samples, params)`` requests and
        return each request's samples (tests and benchmarks call this directly). In lockstep
        (``lockstep``) every rank calls it, with its own requests or none, and it returns
        once every rank's are done."""
        jobs = [Job(list(p), n, params) for p, n, params in requests]
        if jobs:
            self._run(jobs)
        if self.forward.lockstep is not None:
            assert not self.forward.lockstep.open, "generate() runs outside a session"
            with self.model_lock, torch.inference_mode():
                self.forward.lockstep.drain()
        return [list(job.results) for job in jobs]  # type: ignore[arg-type]

    def _run(self, jobs: list[Job], admit: Callable[[Batch], list[Job]] | None = None) -> None:
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
                    if _abandoned(row.job.request):
                        continue  # its caller stopped waiting: the row leaves, unanswered
                    row.tokens.append(token)
                    row.logprobs.append(logprob)
                    row.reason = self._stop_reason(row)
                    if row.reason is None:
                        keep.append(j)
                    else:
                        if editable and self.reuse:
                            self._retain(batch, j)
                        self._finish_row(row)
                if len(keep) != len(batch.rows):
                    tokens_R = batch.select(keep, tokens_R, trim=editable)
                if batch.rows:
                    self.forward.decode_step(batch, tokens_R)
                    self._note_memory(batch)
                if admit is not None and editable:
                    new_jobs = admit(batch)
                    if new_jobs:
                        self.stats.admitted_requests += len(new_jobs)
                        batch = batch.merge(self._prefill(new_jobs))
                        self._note_memory(batch)

    def _prefill(self, jobs: list[Job]) -> Batch:
        if self.reuse:
            for job in jobs:
                job.past = self.retained.take(job.prompt)
        for job in jobs:
            new = len(job.prompt) - (job.past.length if job.past is not None else 0)
            self.stats.prefill_tokens += new
            self.stats.reused_tokens += len(job.prompt) - new
        batch = self.forward.prefill(jobs)
        for job in jobs:
            job.past = None
        self.stats.requests += len(jobs)
        self.stats.rows += len(batch.rows)
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(batch.rows))
        self._note_memory(batch)
        return batch

    def _retain(self, batch: Batch, j: int) -> None:
        """Keep row ``j``'s cache for its trajectory's next turn, if the budget allows."""
        row = batch.rows[j]
        width = int(batch.mask_RL.shape[1]) + self.row_tokens
        held = batch.tokens() + self.row_tokens * len(batch.rows)
        while self.retained.tokens + width + held > self.max_batch_tokens:
            if not self.retained.evict_oldest():
                return
        key = tuple(row.job.prompt) + tuple(row.tokens[:-1])
        entry = retain_row(batch.cache, j, batch.mask_RL, int(batch.next_pos_R[j]))
        self.retained.put(key, entry)

    def _count_forward(self) -> None:
        self.stats.forward_calls += 1

    def _note_memory(self, batch: Batch) -> None:
        held = batch.tokens() + self.retained.tokens
        if held > self.stats.peak_cache_tokens:
            self.stats.peak_cache_tokens = held
        if self.measure_bytes:
            nbytes = kv_cache.nbytes(batch.cache) + self.retained.nbytes()
            self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, nbytes)

    def _finish_row(self, row: Row) -> None:
        job = row.job
        assert row.reason is not None
        job.results[row.index] = SampledSequence(tuple(row.tokens), tuple(row.logprobs), row.reason)
        job.remaining -= 1
        if job.remaining == 0 and job.request is not None and not job.delivered:
            job.delivered = True
            resolve(job.request, result=list(job.results))  # type: ignore[arg-type]

    def _uniform(self, rows: list[Row]) -> torch.Tensor:
        """One U[0, 1) draw per row: seeded rows from their own stream, the rest from the
        provider's stream (so a seeded request does not depend on its batch mates)."""
        shared = torch.rand(len(rows), generator=self._generator)
        for k, row in enumerate(rows):
            if row.generator is not None:
                shared[k] = row.uniform()
        return shared

    def _stop_reason(self, row: Row) -> StopReason | None:
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


def _abandoned(request: SampleRequest | None) -> bool:
    """Whether ``request``'s caller was cancelled (read from the worker thread: a state flag
    that only ever goes from pending to done)."""
    return request is not None and request.future.cancelled()
