"""A dense index on disk: build it from a JSONL corpus (resumably), open it, search it.

The folder ``searchr1 index build CORPUS --out DIR`` writes, its kinds and what they cost:
docs/retrieval.md.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.kit.search.documents import DocumentError, row_title_text
from searchr1.plugins.dense_search.encoders import (
    PROBE_MIN_COSINE,
    Encoder,
    Prefixes,
    load_encoder,
    probe_cosine,
    probe_vector,
)
from searchr1.sdk import (
    Interrupted,
    Stop,
    UserError,
    atomic_write,
    get_logger,
    hold_folder,
    write_text_atomic,
)

if TYPE_CHECKING:
    import numpy as np

#: bump when the folder layout changes
INDEX_FORMAT = 1
KINDS = ("flat", "ivfpq", "hnsw")
CARD, INDEX_FILE, DOCS, OFFSETS, BUILD = (
    "card.json",
    "index.faiss",
    "docs.jsonl",
    "docs.offsets.npy",
    ".build",
)
#: passages encoded between two saves of the build state (what a crash can cost)
SHARD_ROWS = 8192
#: passages encoded at a time; a stop signal is honoured between two (their shard saved)
ENCODE_ROWS = 512
#: HNSW neighbours per node
HNSW_M = 32


class DenseIndexError(UserError, ValueError):
    """A corpus, folder or index that cannot be used; the message names the file and what to
    do (the provider words it as a ConfigError naming its setting; exit code 2)."""


@dataclass(frozen=True)
class IndexCard:
    """``card.json``: what an index is and what it cost."""

    encoder: str
    dim: int
    prefixes: dict[str, str]
    probe: list[float]
    kind: str
    count: int
    bytes: int
    bytes_per_passage: float
    build_seconds: float
    corpus: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    format: int = INDEX_FORMAT

    @classmethod
    def read(cls, folder: Path) -> IndexCard:
        path = folder / CARD
        try:
            raw = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            hint = (
                " (a build was started there: run the same `searchr1 index build` again to "
                "finish it)"
                if (folder / BUILD).is_dir()
                else " (make one with `searchr1 index build CORPUS.jsonl --out DIR`)"
            )
            raise DenseIndexError(
                f"{folder}: not a finished dense index, no {CARD}{hint}"
            ) from None
        except (OSError, ValueError) as exc:
            raise DenseIndexError(f"{path}: unreadable index card ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
            raise DenseIndexError(
                f"{path}: index format {raw.get('format') if isinstance(raw, dict) else '?'} "
                f"is not {INDEX_FORMAT}; rebuild it with this searchr1's `searchr1 index build`"
            )
        try:
            return cls(**raw)
        except TypeError as exc:
            raise DenseIndexError(f"{path}: malformed index card ({exc})") from None

    def summary(self) -> str:
        return (
            f"{self.kind} index of {self.count} passages, encoder {self.encoder} "
            f"({self.dim}-d), {self.bytes_per_passage:.1f} bytes/passage"
        )

    def rebuild_command(self, folder: Path) -> str:
        """The command that builds this index into ``folder`` again, replacing it."""
        return shlex.join(
            [
                "searchr1", "index", "build", str(self.corpus.get("path", "CORPUS.jsonl")),
                "--out", str(folder), "--encoder", self.encoder, "--kind", self.kind, "--force",
            ]
        )  # fmt: skip

    def damaged(self, folder: Path, problem: str) -> DenseIndexError:
        """The error for a file of ``folder`` that disagrees with this card."""
        return DenseIndexError(
            f"{problem}; the index in {folder} cannot be used: rebuild it with "
            f"`{self.rebuild_command(folder)}`"
        )


# ---------------------------------------------------------------------------- the corpus


def corpus_fingerprint(corpus: Path) -> dict[str, Any]:
    stat = corpus.stat()
    return {"path": str(corpus.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _contents(row: dict[str, Any]) -> str:
    """Search-R1's ``contents`` of a row of either layout (title in quotes on line one)."""
    contents = row.get("contents")
    if isinstance(contents, str):
        return contents
    title, text = row_title_text(row)
    return f'"{title}"\n{text}' if title else text


def _corpus_rows(
    corpus: Path, start: int, first_line: int
) -> Iterator[tuple[int, int, dict[str, str]]]:
    """``(byte offset after the row, its line number, {"id", "contents"})`` for each row from
    byte ``start`` (line ``first_line``); DenseIndexError naming the file and line of a bad row."""
    with corpus.open("rb") as fh:
        fh.seek(start)
        offset = start
        for lineno, raw in enumerate(fh, start=first_line):
            offset += len(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                contents = _contents(row)
            except json.JSONDecodeError as exc:
                raise DenseIndexError(f"{corpus}:{lineno}: not valid JSON ({exc.msg})") from None
            except DocumentError as exc:
                raise DenseIndexError(f"{corpus}:{lineno}: {exc}") from None
            # a row without an id gets its line number: stable while the corpus is unchanged
            yield offset, lineno, {"id": str(row.get("id", lineno)), "contents": contents}


# ---------------------------------------------------------------------------- building


@dataclass
class BuildState:
    """``.build/state.json``: how far a build got (all of it saved after each shard)."""

    corpus: dict[str, Any]
    encoder: str
    kind: str
    rows: int = 0
    corpus_offset: int = 0
    corpus_lines: int = 0
    docs_bytes: int = 0
    shards: int = 0
    seconds: float = 0.0

    def same_build(self, other: BuildState) -> bool:
        return (self.corpus, self.encoder, self.kind) == (other.corpus, other.encoder, other.kind)


@dataclass(frozen=True)
class Progress:
    """One report of a running build (after every shard)."""

    rows: int
    bytes_done: int
    bytes_total: int
    seconds: float
    resumed_from: int = 0
    stage: str = "encode"


def build_index(
    corpus: Path,
    out: Path,
    *,
    encoder_name: str = "",
    kind: str = "flat",
    force: bool = False,
    shard_rows: int = SHARD_ROWS,
    on_progress: Callable[[Progress], None] | None = None,
    encoder: Encoder | None = None,
    stop: Stop | None = None,
) -> tuple[IndexCard, str]:
    """Build (or finish building) the index of ``corpus`` in ``out``; returns the card and
    what happened (``"built"``, ``"resumed"``, ``"up to date"``). See the module docstring.
    ``stop`` (the command's): a stop signal ends the build after the current encode batch,
    its passages saved as a shard (Interrupted, naming what was kept). The build holds
    ``out`` (:func:`~searchr1.core.disk.hold_folder`): a second build of it is refused."""
    import faiss  # noqa: F401 - a missing extra fails here, not after hours of encoding

    if kind not in KINDS:
        raise DenseIndexError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    if not corpus.is_file():
        raise DenseIndexError(f"{corpus}: no such corpus file")
    if out.exists() and not out.is_dir():
        raise DenseIndexError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    held = hold_folder(out, "built", "build again: it resumes where that build stopped")
    try:
        return _build(
            corpus,
            out,
            encoder_name=encoder_name,
            kind=kind,
            force=force,
            shard_rows=shard_rows,
            on_progress=on_progress,
            encoder=encoder,
            stop=stop or Stop(),
        )
    finally:
        if held is not None:
            os.close(held)


def _build(
    corpus: Path,
    out: Path,
    *,
    encoder_name: str,
    kind: str,
    force: bool,
    shard_rows: int,
    on_progress: Callable[[Progress], None] | None,
    encoder: Encoder | None,
    stop: Stop,
) -> tuple[IndexCard, str]:
    """:func:`build_index`'s work, in the folder it holds: an index already there (or a build
    that only had its files to move), else the corpus encoded shard by shard, then indexed."""
    with stop.at_once(f"the load of the encoder {encoder_name or 'default'}"):
        encoder = encoder or load_encoder(encoder_name)
    fingerprint = corpus_fingerprint(corpus)
    want = BuildState(corpus=fingerprint, encoder=encoder.name, kind=kind)
    done = _built_already(out, want, force)
    if done is not None:
        return done
    build = out / BUILD
    shards = _Shards(build, _resumable_state(build, want, force), encoder, on_progress)
    shards.encode_corpus(corpus, shard_rows, stop)
    if shards.state.rows == 0:
        raise DenseIndexError(f"{corpus}: the corpus has no documents")
    card = _index_shards(shards, want, stop)
    _commit(out, card)
    return card, ("resumed" if shards.resumed_from else "built")


def _built_already(out: Path, want: BuildState, force: bool) -> tuple[IndexCard, str] | None:
    """The index ``out`` already holds for ``want`` (or a finished build moved into place),
    None to build; another index there is refused unless ``force`` (then its files go)."""
    if not (out / CARD).is_file() and (out / BUILD / CARD).is_file() and not force:
        finished = _finish_commit(out, want)
        if finished is not None:
            return finished, "resumed"
    if not (out / CARD).is_file():
        return None
    card = IndexCard.read(out)
    same = (card.corpus, card.encoder, card.kind) == (want.corpus, want.encoder, want.kind)
    if not force and same:
        problem = _files_problem(out, card)
        if problem:
            raise card.damaged(out, problem)
        return card, "up to date"
    if not force:
        raise DenseIndexError(
            f"{out} already holds an index ({card.summary()}, built from "
            f"{card.corpus.get('path')}); pass --force to replace it or choose another --out"
        )
    for name in (CARD, INDEX_FILE, DOCS, OFFSETS):
        (out / name).unlink(missing_ok=True)
    return None


def _resumable_state(build: Path, want: BuildState, force: bool) -> BuildState:
    """The saved state of an unfinished build of ``want`` to go on from, its files trimmed to
    what that state saved; else ``want`` in an emptied ``build`` folder."""
    build.mkdir(parents=True, exist_ok=True)
    state_path = build / "state.json"
    state = want
    if state_path.is_file():
        try:
            saved = BuildState(**json.loads(state_path.read_text("utf-8")))
        except (ValueError, TypeError):
            saved = None
        if saved is not None and saved.same_build(want) and not force and _can_resume(build, saved):
            state = saved
    if state.rows == 0:  # a fresh start: nothing of an older build is kept
        shutil.rmtree(build)
        build.mkdir(parents=True)
        state = want
    # a crash after a shard's rows were appended but before the state was saved leaves rows
    # past docs_bytes and shard files past ``shards``: both are dropped and redone
    with (build / DOCS).open("ab") as fh:
        fh.truncate(state.docs_bytes)
    for stray in build.glob("emb-*.npy"):
        if int(stray.stem.split("-")[1]) >= state.shards:
            stray.unlink()
    return state


class _Shards:
    """The encode stage: corpus rows gathered into shards of vectors (``emb-N.npy``) beside
    their passages (``docs.jsonl``), the build state saved after each shard."""

    def __init__(
        self,
        build: Path,
        state: BuildState,
        encoder: Encoder,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.build, self.state, self.encoder, self.on_progress = build, state, encoder, on_progress
        self.resumed_from = state.rows
        self.total = state.corpus["size"]
        self.started = time.perf_counter() - state.seconds
        self.pending: list[dict[str, str]] = []  # the rows of the shard being built
        self.encoded: list[np.ndarray] = []  # their vectors, ENCODE_ROWS rows at a time
        self.end = (state.corpus_offset, state.corpus_lines)  # where the pending rows end

    def report(self, stage: str = "encode") -> None:
        if self.on_progress is not None:
            state, seconds = self.state, time.perf_counter() - self.started
            self.on_progress(
                Progress(
                    state.rows, state.corpus_offset, self.total, seconds, self.resumed_from, stage
                )
            )

    def encode_corpus(self, corpus: Path, shard_rows: int, stop: Stop) -> None:
        """Encode the corpus from where the state stopped; a stop saves what is encoded as a
        (short) shard, resumed from there."""
        self.report()
        state = self.state
        rows = _corpus_rows(corpus, state.corpus_offset, state.corpus_lines + 1)
        for end_offset, end_line, row in rows:
            self.pending.append(row)
            self.end = (end_offset, end_line)
            if len(self.pending) >= shard_rows:
                self.flush()
            elif len(self.pending) % ENCODE_ROWS == 0:
                self.encode()
            else:
                continue
            if stop.requested:
                self.flush()
                phase = f"the index build ({state.rows} passages encoded)"
                raise stop.interrupted(phase).outcome(
                    f"{state.rows} encoded passages in {self.build}", ""
                )
        self.flush()

    def encode(self) -> None:
        done = sum(len(v) for v in self.encoded)
        if done < len(self.pending):
            texts = [r["contents"] for r in self.pending[done:]]
            self.encoded.append(self.encoder.encode(texts, query=False))

    def flush(self) -> None:
        """Save the pending rows as one shard and the state that counts it."""
        import numpy as np

        self.encode()
        if not self.pending:
            return
        state = self.state
        shard = self.build / f"emb-{state.shards:06d}.npy"
        with atomic_write(shard, "wb") as fh:
            np.save(fh, np.concatenate(self.encoded).astype(np.float32))
        lines = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in self.pending)
        with (self.build / DOCS).open("ab") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())
        state.rows += len(self.pending)
        state.docs_bytes += len(lines)
        state.corpus_offset, state.corpus_lines = self.end
        state.shards += 1
        state.seconds = time.perf_counter() - self.started
        write_text_atomic(self.build / "state.json", json.dumps(asdict(state)))
        self.pending.clear()
        self.encoded.clear()
        self.report()


def _index_shards(shards: _Shards, want: BuildState, stop: Stop) -> IndexCard:
    """The index stage: the FAISS index over every shard, the passage offsets and the card,
    written in the build folder (nothing to save midway: a stop keeps the encoded shards)."""
    import faiss
    import numpy as np

    build, state, encoder, kind = shards.build, shards.state, shards.encoder, want.kind
    shards.report("index")
    try:
        with stop.at_once(f"the index stage of the build ({state.rows} passages encoded)"):
            index, params = _make_index(build, state.shards, encoder.dim, kind, state.rows)
    except Interrupted as exc:
        raise exc.outcome(f"all {state.rows} passages, encoded, in {build}", "") from None
    faiss.write_index(index, str(build / INDEX_FILE))
    np.save(build / OFFSETS, _offsets(build / DOCS))
    _fsync(build / INDEX_FILE)
    size = (build / INDEX_FILE).stat().st_size
    card = IndexCard(
        encoder=encoder.name,
        dim=encoder.dim,
        prefixes=asdict(encoder.prefixes),
        probe=probe_vector(encoder),
        kind=kind,
        count=state.rows,
        bytes=size,
        bytes_per_passage=round(size / state.rows, 2),
        build_seconds=round(time.perf_counter() - shards.started, 3),
        corpus=want.corpus,
        params=params,
    )
    write_text_atomic(build / CARD, json.dumps(asdict(card), indent=1))  # the build is done
    return card


def _can_resume(build: Path, state: BuildState) -> bool:
    """Whether ``build`` holds what ``state`` says was done: the docs written so far and
    every shard (a build killed while moving its files into place has moved some away)."""
    docs = build / DOCS
    return (
        docs.is_file()
        and docs.stat().st_size >= state.docs_bytes
        and all((build / f"emb-{i:06d}.npy").is_file() for i in range(state.shards))
    )


def _commit(out: Path, card: IndexCard) -> None:
    """Move a finished build's files from ``out/.build`` into ``out``, check them against
    ``card`` and write it last. Run again after a kill it moves what is left: a file already
    moved is in place. DenseIndexError when the moved files disagree with the card."""
    build = out / BUILD
    for name in (INDEX_FILE, DOCS, OFFSETS):
        if (build / name).exists():
            (build / name).replace(out / name)
    problem = _files_problem(out, card)
    if problem:
        raise card.damaged(out, problem)
    (build / CARD).replace(out / CARD)
    shutil.rmtree(build, ignore_errors=True)


def _finish_commit(out: Path, want: BuildState) -> IndexCard | None:
    """The card of a build of ``want`` killed while its files were moved into place, the
    move finished; None when ``.build`` holds another build's card, or the files it left
    disagree with it (then the build starts again, with a warning)."""
    try:
        card = IndexCard.read(out / BUILD)
    except DenseIndexError:
        return None
    if (card.corpus, card.encoder, card.kind) != (want.corpus, want.encoder, want.kind):
        return None
    try:
        _commit(out, card)
    except DenseIndexError as exc:
        get_logger().warning("index_build_restarted", reason=str(exc))
        shutil.rmtree(out / BUILD, ignore_errors=True)
        return None
    return card


def _files_problem(folder: Path, card: IndexCard) -> str | None:
    """What disagrees with ``card`` among the files of ``folder`` (without reading them whole):
    ``index.faiss`` of the size the card recorded, one offset per passage starting at 0 and
    ending at the size of ``docs.jsonl``, and its first and last rows passages. None: agree."""
    import numpy as np

    index_file, offsets_file, docs = folder / INDEX_FILE, folder / OFFSETS, folder / DOCS
    for path in (index_file, offsets_file, docs):
        if not path.is_file():
            return f"{path} is missing"
    size = index_file.stat().st_size
    if size != card.bytes:
        return (
            f"{index_file} is {size} bytes, the card says {card.bytes} (truncated, or the file "
            f"of another build)"
        )
    try:
        offsets = np.load(offsets_file, mmap_mode="r")
    except (OSError, ValueError, EOFError) as exc:
        return f"{offsets_file} is damaged (not a numpy array: {exc})"
    if offsets.ndim != 1 or len(offsets) != card.count + 1:
        return (
            f"{offsets_file} holds {len(offsets) - 1 if offsets.ndim == 1 else '?'} passage "
            f"offsets, the card says {card.count} passages (a file of another build?)"
        )
    docs_size = docs.stat().st_size
    if int(offsets[0]) != 0 or int(offsets[-1]) != docs_size:
        return (
            f"{docs} is {docs_size} bytes, its offsets ({offsets_file}) end at "
            f"{int(offsets[-1])} (a file of another build, or truncated)"
        )
    with docs.open("rb") as fh:
        for i in sorted({0, card.count - 1}):
            fh.seek(int(offsets[i]))
            raw = fh.read(int(offsets[i + 1]) - int(offsets[i]))
            try:
                row = json.loads(raw)
                ok = isinstance(row, dict) and isinstance(row.get("contents"), str)
            except (UnicodeDecodeError, ValueError):
                ok = False
            if not ok:
                return f'{docs} is damaged (passage {i} is not a {{"id", "contents"}} row)'
    return None


def _fsync(path: Path) -> None:
    with path.open("rb") as fh:
        os.fsync(fh.fileno())


def _offsets(docs: Path) -> np.ndarray:
    from array import array

    import numpy as np

    starts = array("q", [0])  # 8 bytes a passage, not a Python int each (wiki-18: 168 MB)
    with docs.open("rb") as fh:
        for raw in fh:
            starts.append(starts[-1] + len(raw))
    return np.frombuffer(starts, dtype=np.int64)


def _shards(build: Path, n: int) -> Iterator[np.ndarray]:
    import numpy as np

    for i in range(n):
        yield np.load(build / f"emb-{i:06d}.npy", mmap_mode="r")


def ivfpq_params(n: int, dim: int) -> dict[str, int]:
    """Inverted lists ~4 sqrt(n) (at least 39 training points each), ``dim / 4`` one-byte PQ
    codes (``dim / 8`` lost ~5 points of recall@1 on the offline world; see
    docs/benchmarks.md); fewer bits per code when the corpus is too small to train 256
    centroids each."""
    nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))
    m = max(1, dim // 4)
    while dim % m:
        m -= 1
    nbits = max(1, min(8, int(math.log2(max(2, n // 39)))))
    return {"nlist": nlist, "m": m, "nbits": nbits}


def _make_index(build: Path, shards: int, dim: int, kind: str, n: int) -> tuple[Any, dict]:
    import faiss
    import numpy as np

    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        params: dict[str, Any] = {}
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        params = {"M": HNSW_M, "efConstruction": 80}
    else:
        params = ivfpq_params(n, dim)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(
            quantizer,
            dim,
            params["nlist"],
            params["m"],
            params["nbits"],
            faiss.METRIC_INNER_PRODUCT,
        )
        # train on an evenly spread sample (the corpus may be sorted by topic): 64 points per
        # list, at most 1.5 M (wiki-18: 18 k lists -> 1.2 M of its 21 M passages)
        want = min(n, max(64 * params["nlist"], 2 ** params["nbits"] * 64, 50_000), 1_500_000)
        step = max(1, n // want)
        sample = np.concatenate([np.asarray(s[::step]) for s in _shards(build, shards)])
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    for vectors in _shards(build, shards):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index, params


# ---------------------------------------------------------------------------- querying


class DenseIndex:
    """An opened index folder: its card, encoder, FAISS index and passages. ``search`` is safe
    to call from several threads."""

    def __init__(
        self,
        folder: Path,
        *,
        encoder_name: str = "",
        nprobe: int = 16,
        ef_search: int = 64,
        encoder: Encoder | None = None,
    ):
        import faiss
        import numpy as np

        self.folder = folder
        self.card = card = IndexCard.read(folder)
        problem = _files_problem(folder, card)  # before the (slow) encoder load
        if problem:
            raise card.damaged(folder, problem)
        if encoder_name.strip() and encoder_name.strip() != card.encoder:
            raise DenseIndexError(
                f"encoder {encoder_name.strip()!r} differs from {card.encoder!r}, the encoder "
                f"that built {folder}: leave the encoder unset to use the index's own, or "
                f"rebuild the index with `searchr1 index build ... --encoder {encoder_name.strip()}`"
            )
        self.encoder = encoder or load_encoder(card.encoder, Prefixes(**card.prefixes))
        cosine = probe_cosine(self.encoder, card.probe)
        if self.encoder.dim != card.dim or cosine < PROBE_MIN_COSINE:
            raise DenseIndexError(
                f"the encoder loaded as {self.encoder.name!r} ({self.encoder.dim}-d) is not the "
                f"one that built {folder} ({card.encoder!r}, {card.dim}-d): its probe vector "
                f"matches with cosine {cosine:.3f} < {PROBE_MIN_COSINE}. Load the same model "
                "files, or rebuild the index with this encoder"
            )
        # memory-mapped: the vectors / inverted lists stay in the file and the OS page cache,
        # shared by every process on the node that opens the same index
        flags = faiss.IO_FLAG_READ_ONLY
        if card.kind == "ivfpq":
            flags |= faiss.IO_FLAG_MMAP
        elif card.kind == "flat":
            flags |= faiss.IO_FLAG_MMAP_IFC
        try:
            self.index = faiss.read_index(str(folder / INDEX_FILE), flags)
        except RuntimeError as exc:  # faiss raises this for any file it cannot read
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise card.damaged(folder, f"{folder / INDEX_FILE} is damaged ({first})") from None
        if (self.index.ntotal, self.index.d) != (card.count, card.dim):
            raise card.damaged(
                folder,
                f"{folder / INDEX_FILE} holds {self.index.ntotal} vectors of {self.index.d} "
                f"dimensions, the card says {card.count} of {card.dim} (a file of another build?)",
            )
        if card.kind == "ivfpq":
            faiss.extract_index_ivf(self.index).nprobe = nprobe
        elif card.kind == "hnsw":
            self.index.hnsw.efSearch = ef_search
        self._offsets = np.load(folder / OFFSETS, mmap_mode="r")
        self._fh = (folder / DOCS).open("rb")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.card.count

    def search(self, queries: list[str], top_k: int) -> list[list[tuple[dict, float]]]:
        """One encode and one FAISS search for all ``queries``: per query, up to ``top_k``
        ``({"id", "contents"}, score)`` best first (score = cosine)."""
        import numpy as np

        if not queries:
            return []
        vectors = self.encoder.encode(list(queries), query=True)
        scores, ids = self.index.search(np.ascontiguousarray(vectors), min(top_k, len(self)))
        return [
            [
                (self.document(int(i)), float(s))
                for i, s in zip(row_ids, row_scores, strict=True)
                if i >= 0
            ]
            for row_ids, row_scores in zip(ids.tolist(), scores.tolist(), strict=True)
        ]

    def ids(self, queries: list[str], top_k: int) -> np.ndarray:
        """The row numbers of the ``top_k`` best passages of each query (-1 pads)."""
        import numpy as np

        vectors = self.encoder.encode(list(queries), query=True)
        return self.index.search(np.ascontiguousarray(vectors), min(top_k, len(self)))[1]

    def document(self, i: int) -> dict[str, str]:
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        if hasattr(os, "pread"):
            raw = os.pread(self._fh.fileno(), end - start, start)
        else:  # pragma: no cover - Windows
            with self._lock:
                self._fh.seek(start)
                raw = self._fh.read(end - start)
        return json.loads(raw)

    def close(self) -> None:
        self._fh.close()
