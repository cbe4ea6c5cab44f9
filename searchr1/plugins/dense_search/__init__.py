"""The ``dense`` search provider: an encoder over a FAISS index that ``searchr1 index build``
wrote, plus ``searchr1 serve-retriever`` to share one index over Search-R1's ``/retrieve``.

Registered through the ``searchr1`` entry point (``dense_search``) and chosen by
``[search] provider = "dense"``; needs ``pip install 'searchr1[dense]'`` (faiss-cpu, wordllama,
sentence-transformers). Settings:
``[search.dense]`` (docs/retrieval.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.batches import QueryBatches
from searchr1.kit.search.documents import row_to_result
from searchr1.sdk import (
    ConfigError,
    Register,
    SearchConfig,
    SearchFactory,
    SearchResponse,
    hookimpl,
    plugin_settings,
)

if TYPE_CHECKING:
    from searchr1.plugins.dense_search.index import DenseIndex
    from searchr1.sdk import Config


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
        self._batches = QueryBatches(self._answer, self.options, self.name)

    @classmethod
    def from_config(cls, config: Config) -> DenseSearch:
        if problems := check_index(config):
            raise ConfigError(problems)
        options = dense_settings(config)
        return cls(config.search, options, open_index(options.index, options, "search.dense.index"))

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        return await self._batches.ask(query, top_k)

    async def _answer(self, queries: list[str], top_k: int) -> list[SearchResponse]:
        """One encode + one search for the whole batch, in a worker thread."""
        found = await asyncio.to_thread(self.index.search, queries, top_k)
        return [
            SearchResponse(results=tuple(row_to_result(doc, score) for doc, score in hits))
            for hits in found
        ]

    async def aclose(self) -> None:
        self._batches.cancel()
        self.index.close()


def advise(config: Config) -> list[str]:
    """What ``config check`` and every run warn of without loading anything: wordllama (the
    default encoder's library) not installed."""
    import importlib.util

    if importlib.util.find_spec("wordllama") is None:
        return ["search provider 'dense' needs wordllama: pip install 'searchr1[dense]'"]
    return []


@hookimpl
def register_search_providers(register: Register[SearchFactory]) -> None:
    register(
        "dense",
        DenseSearch.from_config,
        settings=DenseSearchSettings,
        advise=advise,
        check=check_index,
    )
