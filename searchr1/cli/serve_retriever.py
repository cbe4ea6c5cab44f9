"""``searchr1 serve-retriever --index DIR``: one dense index shared over HTTP with Search-R1's
``POST /retrieve`` protocol (:mod:`searchr1.plugins.dense_search.server`), so several trainers
or nodes search one copy; the ``search_r1`` provider is its client. SIGINT / SIGTERM stop it
after the requests in flight (at most a few seconds): exit 130 / 143, as a shell reports a
process a signal ended."""

from __future__ import annotations

import argparse
import math
import signal

from searchr1.cli.args import whole_number
from searchr1.core.errors import ConfigError, UserError

#: ``--batch-window-ms``'s upper end: past a second, waiting only adds latency
MAX_WINDOW_MS = 1000.0
#: ``--nprobe`` / ``--ef-search``'s upper end (FAISS allocates per query in proportion)
MAX_BREADTH = 65536


def window_ms(text: str) -> float:
    """``--batch-window-ms``: milliseconds from 0 to :data:`MAX_WINDOW_MS`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_WINDOW_MS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"must be milliseconds from 0 to {MAX_WINDOW_MS:g}, got {text!r}"
        )
    return value


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    try:
        from searchr1.plugins.dense_search.server import RETRIEVE_PATH, RetrieverServer
    except ImportError as exc:
        raise UserError(
            f"serve-retriever needs {exc.name}: pip install 'searchr1[dense]'"
        ) from None
    from searchr1.plugins.dense_search import DenseSearchSettings, open_index

    settings = DenseSearchSettings(
        index=args.index, encoder=args.encoder, nprobe=args.nprobe, ef_search=args.ef_search
    )
    try:
        index = open_index(args.index, settings, "--index")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    try:
        server = RetrieverServer(index, args.host, args.port, args.batch_window_ms)
    except OSError as exc:
        index.close()
        raise UserError(
            f"--host {args.host} --port {args.port}: cannot listen there "
            f"({exc.strerror or exc}): pick another --port (0 = any free one) or an address "
            "of this machine for --host"
        ) from None
    print(f"serving {args.index}: {index.card.summary()}", flush=True)
    print(f"listening on {server.url}{RETRIEVE_PATH}", flush=True)
    try:
        signum = server.serve()
    finally:
        server.close()
        index.close()
    by = f" by {signal.Signals(signum).name}" if signum else ""
    print(f"stopped{by} after {server.requests_served} /retrieve requests answered", flush=True)
    return 128 + signum if signum else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve-retriever",
        help="serve a dense index over Search-R1's POST /retrieve protocol",
    )
    p.add_argument("--index", required=True, help="folder written by `searchr1 index build`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument(
        "--port",
        type=whole_number(0, 65535),
        default=8000,
        help="port (default: 8000; 0 = any free)",
    )
    p.add_argument("--encoder", default="", help="must match the index card's (default: it)")
    p.add_argument(
        "--nprobe", type=whole_number(1, MAX_BREADTH), default=16, help="ivfpq lists per query"
    )
    p.add_argument(
        "--ef-search", type=whole_number(1, MAX_BREADTH), default=64, help="hnsw search breadth"
    )
    p.add_argument(
        "--batch-window-ms",
        type=window_ms,
        default=0.0,
        help="after a request arrives, wait this long for others to share its encode + search "
        "(default: 0: the requests that arrive while a search runs share the next one; "
        f"up to {MAX_WINDOW_MS:g})",
    )
    p.set_defaults(func=cmd_serve_retriever)
