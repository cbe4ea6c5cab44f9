"""``searchr1 serve-retriever --index DIR``: one dense index shared over HTTP with Search-R1's
``POST /retrieve`` protocol (:mod:`searchr1.plugins.dense_search.server`), so several trainers
or nodes search one copy; the ``search_r1`` provider is its client."""

from __future__ import annotations

import argparse
import signal
from types import FrameType

from searchr1.cli.args import whole_number
from searchr1.core.errors import ConfigError, UserError


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from searchr1.plugins.dense_search import DenseSearchSettings, open_index

    settings = DenseSearchSettings(
        index=args.index, encoder=args.encoder, nprobe=args.nprobe, ef_search=args.ef_search
    )
    try:
        index = open_index(args.index, settings, "--index")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    from searchr1.plugins.dense_search.server import RETRIEVE_PATH, RetrieverServer

    try:
        server = RetrieverServer(index, args.host, args.port, args.batch_window_ms)
    except OSError as exc:
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen ({exc})") from None

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # `docker stop` ends it like Ctrl-C
    print(f"serving {args.index}: {index.card.summary()}", flush=True)
    print(f"listening on {server.url}{RETRIEVE_PATH}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        index.close()
    print(f"stopped after {server.requests_served} /retrieve requests answered", flush=True)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve-retriever",
        help="serve a dense index over Search-R1's POST /retrieve protocol",
    )
    p.add_argument("--index", required=True, help="folder written by `searchr1 index build`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument(
        "--port", type=whole_number(0), default=8000, help="port (default: 8000; 0 = any free)"
    )
    p.add_argument("--encoder", default="", help="must match the index card's (default: it)")
    p.add_argument("--nprobe", type=whole_number(1), default=16, help="ivfpq lists per query")
    p.add_argument("--ef-search", type=whole_number(1), default=64, help="hnsw search breadth")
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=5.0,
        help="requests arriving this close together share one encode + search (default: 5)",
    )
    p.set_defaults(func=cmd_serve_retriever)
