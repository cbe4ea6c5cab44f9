"""``searchr1 index build CORPUS.jsonl --out DIR``: the dense index the ``dense`` provider and
``searchr1 serve-retriever`` read (:mod:`searchr1.plugins.dense_search.index`).

Streams the corpus (Search-R1's ``{"id", "contents"}`` rows or ``{"title", "text"}``), shows a
progress bar with rate and ETA on a terminal (JSON lines otherwise), and resumes a build that
died, or that SIGINT/SIGTERM stopped (exit 130/143, after saving what it encoded), when the
same command runs again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.cli.args import whole_number
from searchr1.core.errors import Interrupted, UserError
from searchr1.core.stop import Stop

if TYPE_CHECKING:
    from searchr1.plugins.dense_search.index import IndexCard


def cmd_index_build(args: argparse.Namespace) -> int:
    try:
        from searchr1.plugins.dense_search.encoders import DEFAULT_ENCODER, EncoderError
        from searchr1.plugins.dense_search.index import DenseIndexError, build_index
    except ImportError as exc:
        raise UserError(
            f"searchr1 index build needs {exc.name}: pip install 'searchr1[dense]'"
        ) from None
    from searchr1.cli.args import command_assets
    from searchr1.core.assets import resolve

    try:
        corpus = Path(resolve(args.corpus, command_assets(args, args.corpus)))
    except FileNotFoundError as exc:
        raise UserError(f"CORPUS {args.corpus!r}: {exc}") from None
    report = _TerminalProgress() if sys.stderr.isatty() else _json_progress
    try:
        with Stop().installed() as stop:
            card, what = build_index(
                corpus,
                Path(args.out),
                encoder_name=args.encoder or DEFAULT_ENCODER,
                kind=args.kind,
                force=args.force,
                shard_rows=args.shard_size,
                on_progress=report,
                stop=stop,
            )
    except Interrupted as exc:
        again = [a for a in sys.argv[1:] if a != "--force"]  # --force would start over
        command = shlex.join(["searchr1", *again]) if again else "searchr1 index build"
        kept = exc.kept or "nothing new (a build state saved before is as it was)"
        raise exc.outcome(kept, f"resume the build with `{command}`") from None
    except (DenseIndexError, EncoderError) as exc:
        raise UserError(str(exc)) from None
    except ImportError as exc:
        raise UserError(
            f"searchr1 index build needs {exc.name}: pip install 'searchr1[dense]'"
        ) from None
    finally:
        if isinstance(report, _TerminalProgress):
            report.close()
    _say_built(args.out, card, what, json_lines=report is _json_progress)
    return 0


def _say_built(out: str, card: IndexCard, what: str, *, json_lines: bool) -> None:
    """The build's outcome: an ``index_built`` JSON line when piped (stdout stays JSON
    lines), else one sentence."""
    rate = card.count / card.build_seconds if card.build_seconds else 0.0
    if json_lines:
        done = {
            "event": "index_built",
            "outcome": what,
            "out": out,
            "kind": card.kind,
            "encoder": card.encoder,
            "passages": card.count,
            "bytes": card.bytes,
            "seconds": card.build_seconds,
            "passages_per_s": round(rate, 1),
        }
        print(json.dumps(done), flush=True)
        return
    print(
        f"{what}: {out}: {card.summary()}; {card.bytes} bytes; "
        f"{card.build_seconds:.1f} s ({rate:.0f} passages/s)",
        flush=True,
    )


def _json_progress(p: object) -> None:
    from searchr1.plugins.dense_search.index import Progress

    assert isinstance(p, Progress)
    rate = (p.rows - p.resumed_from) / p.seconds if p.seconds > 0 else 0.0
    done = p.bytes_done / p.bytes_total if p.bytes_total else 1.0
    eta = p.seconds * (1 - done) / done if 0 < done < 1 else 0.0
    line = {
        "event": "index_progress",
        "stage": p.stage,
        "passages": p.rows,
        "percent": round(100 * done, 1),
        "passages_per_s": round(rate, 1),
        "eta_s": round(eta, 1),
    }
    if p.resumed_from:
        line["resumed_from"] = p.resumed_from
    print(json.dumps(line), flush=True)


class _TerminalProgress:
    """A tqdm bar over the corpus bytes (so the ETA holds before the row count is known)."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, p: object) -> None:
        from tqdm import tqdm

        from searchr1.plugins.dense_search.index import Progress

        assert isinstance(p, Progress)
        if self.bar is None:
            self.bar = tqdm(
                total=p.bytes_total,
                initial=p.bytes_done,
                unit="B",
                unit_scale=True,
                desc="index build",
                file=sys.stderr,
                dynamic_ncols=True,
            )
            if p.resumed_from:
                self.bar.write(f"resuming at passage {p.resumed_from}", file=sys.stderr)
        rate = (p.rows - p.resumed_from) / p.seconds if p.seconds > 0 else 0.0
        self.bar.set_postfix_str(f"{p.rows} passages, {rate:.0f}/s, {p.stage}", refresh=False)
        self.bar.update(max(0, p.bytes_done - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("index", help="dense retrieval indexes (the dense provider)")
    isub = p.add_subparsers(dest="index_command", required=True)
    b = isub.add_parser(
        "build",
        help="encode a JSONL corpus into a FAISS index folder (resumable)",
        description="Encode CORPUS into a FAISS index in DIR. Running the same command again "
        "after a crash resumes from the last saved shard.",
    )
    b.add_argument("corpus", help='JSONL corpus: {"id","contents"} or {"title","text"} rows')
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument(
        "--encoder",
        default="",
        help="wordllama:l2_supercat (default: static embeddings shipped in the wordllama "
        "wheel, offline) or a sentence-transformers model folder/name, e.g. intfloat/e5-base-v2",
    )
    b.add_argument(
        "--kind",
        default="flat",
        choices=("flat", "ivfpq", "hnsw"),
        help="flat: exact, 4 bytes x dim per passage; ivfpq: compressed (dim/4 + 8 bytes per "
        "passage), memory-mapped; hnsw: fast graph, not smaller (default: flat)",
    )
    b.add_argument("--force", action="store_true", help="replace an existing index in DIR")
    b.add_argument(
        "--shard-size",
        type=whole_number(1),
        default=8192,
        help="passages encoded between two saves of the build state (default: 8192)",
    )
    b.set_defaults(func=cmd_index_build)
