"""The ``dense`` search provider: an encoder over a FAISS index that ``searchr1 index build``
wrote, plus ``searchr1 serve-retriever`` to share one index over Search-R1's ``/retrieve``.

Registered through the ``searchr1`` entry point (``dense_search``) and chosen by
``[search] provider = "dense"``; needs ``pip install 'searchr1[dense]'`` (faiss-cpu, wordllama,
sentence-transformers). Its own table::

    [search.dense]
    index = "DIR"          # the folder `searchr1 index build CORPUS.jsonl --out DIR` wrote
    encoder = ""           # empty: the encoder named in the index card; else must match it
    nprobe = 16            # ivfpq: inverted lists searched per query (more: better recall)
    ef_search = 64         # hnsw: candidate list size per query
    batch_window_ms = 5.0  # queries arriving this close together share one encode + search
    max_batch = 64

Modules: :mod:`.encoders` (static wordllama embeddings and sentence-transformers models, with
their query/passage prefixes), :mod:`.index` (build, card, open, search), :mod:`.server` (the
``/retrieve`` HTTP server). Importing this package is cheap: faiss and the encoders load when
a provider is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.config_schema import SearchConfig
from searchr1.core.config_validate import plugin_settings
from searchr1.core.errors import ConfigError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.logs import get_logger
from searchr1.core.types import SearchResponse
from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.documents import row_to_result

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config
    from searchr1.plugins.dense_search.index import DenseIndex

Pending = list[tuple[str, int, "asyncio.Future[SearchResponse]"]]


@dataclass(frozen=True)
class DenseSearchSettings:
    """``[search.dense]``."""

    #: the folder `searchr1 index build CORPUS.jsonl --out DIR` wrote
    index: str = ""
    #: empty = the encoder named in the index card; else it must match it
    encoder: str = ""
    #: ivfpq: inverted lists searched per query (more: better recall, slower)
    nprobe: int = field(default=16, metadata={"min": 1})
    #: hnsw: candidate list size per query
    ef_search: int = field(default=64, metadata={"min": 1})
    #: queries arriving this close together share one encode + search
    batch_window_ms: float = field(default=5.0, metadata={"min": 0})
    #: queries per encode + search at most
    max_batch: int = field(default=64, metadata={"min": 1})


def dense_settings(config: Config) -> DenseSearchSettings:
    """``[search.dense]``, checked; ConfigError naming the key otherwise."""
    return plugin_settings(config, "search", "dense", DenseSearchSettings)


def check_index(config: Config) -> list[str]:
    """The provider's ``check`` (and its factory's first step): faiss installed, and
    ``[search.dense] index`` set to a folder that holds a finished index (its ``card.json``,
    written last by ``searchr1 index build``, read as opening the index reads it); no vector
    or document is loaded."""
    import importlib.util

    folder = dense_settings(config).index.strip()
    where = config.where("search.dense.index")
    out = []
    if importlib.util.find_spec("faiss") is None:
        out.append(f"{where}: search provider 'dense' needs faiss: pip install 'searchr1[dense]'")
    if not folder:
        out.append(
            f"{where}: search.dense.index is not set: the dense provider needs the folder that "
            "`searchr1 index build CORPUS.jsonl --out DIR` wrote, e.g. "
            '[search.dense] index = "indexes/wiki"'
        )
    else:
        from searchr1.plugins.dense_search.index import DenseIndexError, IndexCard

        try:  # the card alone (the index's own reading of it): a build that never finished
            IndexCard.read(Path(folder).expanduser())
        except DenseIndexError as exc:
            out.append(f"{where}: search.dense.index = {folder!r}: {exc}")
    return out


def open_index(folder: str, settings: DenseSearchSettings, what: str) -> DenseIndex:
    """The index in ``folder``; ConfigError naming ``what`` (the key or flag) otherwise."""
    try:
        from searchr1.plugins.dense_search.encoders import EncoderError
        from searchr1.plugins.dense_search.index import DenseIndex, DenseIndexError
    except ImportError as exc:  # faiss missing
        raise ConfigError(
            [f"{what}: the dense provider needs {exc.name}: pip install 'searchr1[dense]'"]
        ) from None
    try:
        return DenseIndex(
            Path(folder).expanduser(),
            encoder_name=settings.encoder,
            nprobe=settings.nprobe,
            ef_search=settings.ef_search,
        )
    except (DenseIndexError, EncoderError) as exc:
        raise ConfigError([f"{what} = {folder!r}: {exc}"]) from None
    except ImportError as exc:
        raise ConfigError(
            [f"{what}: the dense provider needs {exc.name}: pip install 'searchr1[dense]'"]
        ) from None


class DenseSearch(BaseSearchProvider):
    """Queries that arrive within ``batch_window_ms`` of each other (the trajectories of a
    rollout) are encoded and searched together in a worker thread; see the module docstring."""

    name = "dense"

    def __init__(self, settings: SearchConfig, options: DenseSearchSettings, index: DenseIndex):
        super().__init__(settings)
        self.options = options
        self.index = index
        self._pending: Pending = []
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(cls, config: Config) -> DenseSearch:
        if problems := check_index(config):
            raise ConfigError(problems)
        options = dense_settings(config)
        return cls(config.search, options, open_index(options.index, options, "search.dense.index"))

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        future: asyncio.Future[SearchResponse] = asyncio.get_running_loop().create_future()
        self._pending.append((query, top_k, future))
        if len(self._pending) >= self.options.max_batch:
            self._start(self._run(self._take()))
        elif len(self._pending) == 1:
            self._start(self._run_after_window(self._pending))
        return await future

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.index.close()

    def _start(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self) -> Pending:
        batch, self._pending = self._pending, []
        return batch

    async def _run_after_window(self, batch: Pending) -> None:
        await asyncio.sleep(self.options.batch_window_ms / 1000.0)
        if self._pending is batch:  # not already sent because it filled up
            await self._run(self._take())

    async def _run(self, batch: Pending) -> None:
        """One encode + one search for the whole batch; every future gets a response."""
        fallback = "search failed (internal error)"
        try:
            top_k = max(k for _, k, _ in batch)
            found = await asyncio.to_thread(self.index.search, [q for q, _, _ in batch], top_k)
            for (_, k, future), hits in zip(batch, found, strict=True):
                if not future.done():
                    results = tuple(row_to_result(doc, score) for doc, score in hits[:k])
                    future.set_result(SearchResponse(results=results))
        except asyncio.CancelledError:
            fallback = "search cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - the rollout must go on
            get_logger().error(
                "search_internal_error", provider=self.name, error=type(exc).__name__
            )
        finally:
            for _, _, future in batch:
                if not future.done():
                    future.set_result(SearchResponse(error=fallback))


def advise(config: Config) -> list[str]:
    """What ``config check`` and every run warn of without loading anything: wordllama (the
    default encoder's library) not installed."""
    import importlib.util

    if importlib.util.find_spec("wordllama") is None:
        return ["search provider 'dense' needs wordllama: pip install 'searchr1[dense]'"]
    return []


@hookimpl
def register_search_providers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register(
        "dense",
        DenseSearch.from_config,
        settings=DenseSearchSettings,
        advise=advise,
        check=check_index,
    )
