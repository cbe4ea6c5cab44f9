"""The ``local`` search provider: offline BM25 over a JSONL corpus, with ``bm25s``.

Registered through the ``searchr1`` entry point (``local_search``) and chosen by
``[search] provider = "local"``; this is the embedded offline default and what the tests use.
Settings: ``[search.local]`` (docs/reference/config.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.documents import DocumentError, row_title_text
from searchr1.sdk import (
    ConfigError,
    Register,
    SearchConfig,
    SearchFactory,
    SearchResponse,
    SearchResult,
    cache_dir,
    get_logger,
    hookimpl,
    make_temp_dir,
    match_umask,
    plugin_settings,
    resolve_asset,
)

if TYPE_CHECKING:
    import numpy as np

    from searchr1.sdk import Config

#: bump when the on-disk layout written by _build changes
INDEX_FORMAT = 1
#: corpora at least this large are scored in a worker thread so the event loop keeps
#: serving other trajectories; smaller ones answer in about a millisecond inline
THREAD_MIN_DOCS = 200_000


@dataclass(frozen=True)
class LocalSearchSettings:
    """``[search.local]``."""

    #: JSONL corpus: builtin:world/corpus.jsonl or a path (Search-R1 rows or {title, text})
    corpus: str = ""
    #: BM25 term saturation
    k1: float = field(default=0.9, metadata={"min": 0})
    #: BM25 length normalisation
    b: float = field(default=0.4, metadata={"min": 0})
    #: bm25s stop-word list; "" keeps every token
    stopwords: str = "en"


class Bm25Index:
    """A bm25s index over one corpus file plus the byte span of each indexed row.

    Built or loaded by :meth:`open` (once per provider); :meth:`search` is then cheap and
    safe to call from several threads."""

    def __init__(self, corpus: Path, retriever: Any, spans: np.ndarray, stopwords: str):
        self.corpus = corpus
        self._retriever = retriever
        self._spans = spans  # shape (2, N): start and end byte offset of each row
        self._stopwords = stopwords or None
        self._fh = corpus.open("rb")
        self._read_lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._spans.shape[1])

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, corpus: Path, settings: LocalSearchSettings) -> Bm25Index:
        """Load the cached index of ``corpus`` or build (and cache) it."""
        import bm25s
        import numpy as np

        fingerprint = _fingerprint(corpus, settings, bm25s.__version__)
        folder = _index_folder(corpus)
        loaded = _load(folder, fingerprint)
        if loaded is not None:
            retriever, spans = loaded
            return cls(corpus, retriever, spans, settings.stopwords)
        start = time.perf_counter()
        texts, spans_list = _read_corpus(corpus)
        tokens = bm25s.tokenize(
            texts, lower=True, stopwords=settings.stopwords or None, show_progress=False
        )
        retriever = bm25s.BM25(k1=settings.k1, b=settings.b)
        retriever.index(tokens, show_progress=False)
        spans = np.asarray(spans_list, dtype=np.int64).T.copy()
        _save(folder, fingerprint, retriever, spans)
        get_logger().info(
            "search_index_built",
            corpus=str(corpus),
            documents=len(texts),
            index=str(folder),
            seconds=round(time.perf_counter() - start, 3),
        )
        return cls(corpus, retriever, spans, settings.stopwords)

    # ---------------------------------------------------------------- querying

    def search(self, query: str, top_k: int) -> tuple[SearchResult, ...]:
        """The best ``top_k`` rows with a positive BM25 score (fewer, or none, when fewer rows
        share a term with the query)."""
        import bm25s

        tokens = bm25s.tokenize(
            [query], lower=True, stopwords=self._stopwords, return_ids=False, show_progress=False
        )
        if not tokens or not tokens[0]:
            return ()
        k = min(top_k, len(self))
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        out: list[SearchResult] = []
        for doc, score in zip(docs[0].tolist(), scores[0].tolist(), strict=True):
            if score <= 0.0:
                continue
            title, text = self._row(int(doc))
            out.append(SearchResult(title=title, text=text, score=float(score)))
        return tuple(out)

    def _row(self, index: int) -> tuple[str, str]:
        start, end = int(self._spans[0, index]), int(self._spans[1, index])
        if hasattr(os, "pread"):
            raw = os.pread(self._fh.fileno(), end - start, start)
        else:  # pragma: no cover - Windows
            with self._read_lock:
                self._fh.seek(start)
                raw = self._fh.read(end - start)
        return row_title_text(json.loads(raw))

    def close(self) -> None:
        self._fh.close()


# -------------------------------------------------------------------- index cache helpers


def _fingerprint(corpus: Path, settings: LocalSearchSettings, bm25s_version: str) -> dict:
    stat = corpus.stat()
    return {
        "format": INDEX_FORMAT,
        "bm25s": bm25s_version,
        "corpus": str(corpus.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "k1": settings.k1,
        "b": settings.b,
        "stopwords": settings.stopwords,
    }


def _index_folder(corpus: Path) -> Path:
    """Next to the corpus when that folder is writable, else in the searchr1 cache."""
    parent = corpus.resolve().parent
    if os.access(parent, os.W_OK):
        return parent / f".{corpus.name}.bm25"
    digest = hashlib.sha1(str(corpus.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "bm25" / f"{corpus.name}-{digest}"


def _read_corpus(corpus: Path) -> tuple[list[str], list[tuple[int, int]]]:
    """The text to index and the byte span of every non-blank row; ValueError naming the
    file and line of the first bad row."""
    texts: list[str] = []
    spans: list[tuple[int, int]] = []
    offset = 0
    with corpus.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                title, text = row_title_text(json.loads(raw))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{corpus}:{lineno}: not valid JSON ({exc.msg})") from None
            except DocumentError as exc:
                raise ValueError(f"{corpus}:{lineno}: {exc}") from None
            texts.append(f"{title} {text}" if title else text)
            spans.append((start, start + len(raw.rstrip(b"\r\n"))))
    if not texts:
        raise ValueError(f"{corpus}: the corpus has no documents")
    return texts, spans


def _load(folder: Path, fingerprint: dict) -> tuple[Any, np.ndarray] | None:
    """The cached retriever and spans when ``folder`` holds an index of this exact corpus."""
    import bm25s
    import numpy as np

    try:
        meta = json.loads((folder / "meta.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if meta != fingerprint:
        return None
    try:
        retriever = bm25s.BM25.load(str(folder), show_progress=False)
        spans = np.load(folder / "spans.npy")
    except Exception:  # noqa: BLE001 - a damaged cache is rebuilt, not fatal
        get_logger().warning("search_index_unreadable", index=str(folder))
        return None
    return retriever, spans


def _save(folder: Path, fingerprint: dict, retriever: Any, spans: np.ndarray) -> None:
    """Write the index to a temporary folder and swap it into place, so a crash never leaves
    a half-written index that looks valid (meta.json is written last). A failure to cache is
    logged, not fatal: the index in memory still serves this run."""
    import numpy as np

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(folder.parent, f"{folder.name}.tmp-")
    except OSError as exc:
        get_logger().warning("search_index_not_cached", index=str(folder), error=str(exc))
        return
    try:
        retriever.save(str(tmp), show_progress=False)
        np.save(tmp / "spans.npy", spans)
        (tmp / "meta.json").write_text(json.dumps(fingerprint), "utf-8")
        match_umask(tmp)
        if folder.exists():
            trash = make_temp_dir(folder.parent, f"{folder.name}.old-")
            folder.rename(trash / "index")
            shutil.rmtree(trash, ignore_errors=True)
        tmp.rename(folder)
    except OSError as exc:  # e.g. a concurrent process swapped its own copy in first
        get_logger().warning("search_index_not_cached", index=str(folder), error=str(exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -------------------------------------------------------------------- provider


class LocalBM25Search(BaseSearchProvider):
    """``search`` over a :class:`Bm25Index`; no network, no keys, always available."""

    name = "local"

    def __init__(self, settings: SearchConfig, index: Bm25Index):
        super().__init__(settings)
        self.index = index

    @classmethod
    def from_config(cls, config: Config) -> LocalBM25Search:
        if problems := check_corpus(config):
            raise ConfigError(problems)
        local = local_settings(config)
        path = Path(resolve_asset(local.corpus, config.assets))
        try:
            index = Bm25Index.open(path, local)
        except ValueError as exc:
            raise ConfigError([f"search.local.corpus = {local.corpus!r}: {exc}"]) from None
        return cls(config.search, index)

    async def _fetch(self, query: str, top_k: int) -> SearchResponse:
        if len(self.index) >= THREAD_MIN_DOCS:
            results = await asyncio.to_thread(self.index.search, query, top_k)
        else:
            results = self.index.search(query, top_k)
        return SearchResponse(results=results)

    async def aclose(self) -> None:
        self.index.close()


def local_settings(config: Config) -> LocalSearchSettings:
    """``[search.local]``, checked; ConfigError naming the key otherwise."""
    return plugin_settings(config, "search", "local", LocalSearchSettings)


def check_corpus(config: Config) -> list[str]:
    """The provider's ``check`` (and its factory's first step): ``[search.local] corpus``
    set and naming a file (a ``builtin:`` corpus is built here, as the run would)."""
    corpus = local_settings(config).corpus
    where = config.where("search.local.corpus")
    if not corpus.strip():
        return [
            f"{where}: search.local.corpus is not set: the local provider needs a JSONL corpus, "
            'e.g. [search.local] corpus = "builtin:world/corpus.jsonl"'
        ]
    try:
        path = Path(resolve_asset(corpus, config.assets))
    except FileNotFoundError as exc:  # an unknown builtin: asset or file
        return [f"{where}: search.local.corpus: {exc}"]
    if not path.is_file():
        return [
            f"{where}: search.local.corpus = {corpus!r}: no such file ({path.absolute()}; a "
            "relative path is read from the working directory)"
        ]
    return []


@hookimpl
def register_search_providers(register: Register[SearchFactory]) -> None:
    register(
        "local",
        LocalBM25Search.from_config,
        settings=LocalSearchSettings,
        default="BM25 over [search.local] corpus on this machine",
        check=check_corpus,
    )
