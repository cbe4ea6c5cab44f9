"""Queries of a rollout that arrive together, sent to the backend in one call (an encode and
index search, a ``/retrieve`` request): a provider's ``_fetch`` asks :class:`QueryBatches`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from searchr1.sdk import SearchResponse, get_logger

#: one response per query, in order
Answer = Callable[[list[str], int], Awaitable[list[SearchResponse]]]
Batch = list[tuple[str, "asyncio.Future[SearchResponse]"]]


class QueryBatches:
    """Queries of one ``top_k`` that arrive within ``batch_window_ms`` of the first go to one
    ``answer`` call, up to ``max_batch`` a call (a full batch goes at once). Every query gets
    a response: ``answer``'s, or an error response when ``answer`` raises (logged as
    ``search_internal_error`` of ``provider``) or the call is cancelled (:meth:`cancel`)."""

    def __init__(self, answer: Answer, options: Any, provider: str):
        """``options``: the provider's settings, with ``batch_window_ms`` and ``max_batch``."""
        self._answer, self.provider = answer, provider
        self.window_s, self.max_batch = options.batch_window_ms / 1000.0, options.max_batch
        self._pending: dict[int, Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def ask(self, query: str, top_k: int) -> SearchResponse:
        """``query``'s response, answered with the batch it joins."""
        future: asyncio.Future[SearchResponse] = asyncio.get_running_loop().create_future()
        batch = self._pending.setdefault(top_k, [])
        batch.append((query, future))
        if len(batch) >= self.max_batch:
            del self._pending[top_k]
            self._start(self._send(batch, top_k))
        elif len(batch) == 1:
            self._start(self._send(batch, top_k, after=self.window_s))
        return await future

    def cancel(self) -> None:
        """Cancel the calls in flight (their queries get a "search cancelled" response)."""
        for task in list(self._tasks):
            task.cancel()

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: Batch, top_k: int, after: float | None = None) -> None:
        """``batch`` to ``answer``; ``after`` seconds of the window first, unless it fills up."""
        if after is not None:
            await asyncio.sleep(after)
            if self._pending.get(top_k) is not batch:  # already sent: it filled up
                return
            del self._pending[top_k]
        fallback = "search failed (internal error)"
        try:
            answers = await self._answer([query for query, _ in batch], top_k)
            for (_, future), response in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(response)
        except asyncio.CancelledError:
            fallback = "search cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - answered below; the rollout must go on
            get_logger().error(
                "search_internal_error", provider=self.provider, error=type(exc).__name__
            )
        finally:
            for _, future in batch:
                if not future.done():
                    future.set_result(SearchResponse(error=fallback))
