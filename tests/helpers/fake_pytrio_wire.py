"""The wire side of the fake PyTRIO service (``tests/helpers/fake_pytrio_service.py``): the HTTP
handler (JSON control API under ``/api``, msgpack actor events and JSON samples under
``/actor``) and the tensor encoding the SDK reads back."""

from __future__ import annotations

import itertools
import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgpack
import numpy as np


class Reply(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON error body."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def wire(array: np.ndarray) -> dict[str, Any]:
    data = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "<f4", "shape": list(data.shape), "encoding": "raw_le", "data": data.tobytes()}


def handler_for(fake: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def _handle(self, method: str) -> None:
            start = time.monotonic()
            try:
                self._route(method)
            finally:
                fake.log_request(method, urlsplit(self.path).path, start, time.monotonic())

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            path = parts.path
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake._bump(f"{method} {path}")
            fault = fake.take_fault(method, path)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            try:
                if fault is not None and fault.body is not None:
                    self._send(200, "text/html", fault.body)
                    return
                if fault is not None and fault.status:
                    raise Reply(
                        fault.status,
                        fault.code or f"http_{fault.status}",
                        f"injected HTTP {fault.status}",
                    )
                if path.startswith("/api/"):
                    body = json.loads(raw) if raw else {}
                    self._json(200, fake.control(method, path, query, body, self.headers))
                elif path.startswith("/actor/"):
                    self._actor(method, path.removeprefix("/actor/"), raw)
                else:
                    raise Reply(404, "not_found", path)
            except Reply as reply:
                self._json(reply.status, {"code": reply.code, "message": reply.message})
            except Exception as exc:  # a bug in the fake or a request the SDK models reject
                self._json(
                    400, {"code": "invalid_request", "message": f"{type(exc).__name__}: {exc}"}
                )

        def _actor(self, method: str, route: str, raw: bytes) -> None:
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if method == "POST" and route == "v1/events":
                status, body = fake.actor_event(raw, token)
                self._msgpack(status, body)
                return
            m = re.fullmatch(r"v1/events/([^/]+)", route)
            if method == "GET" and m:
                wait = re.search(r"wait=(\d+)", self.headers.get("Prefer", ""))
                self._msgpack(
                    200, fake.get_event(m.group(1), float(wait.group(1)) if wait else 0.0)
                )
                return
            if method == "POST" and route == "v1/client/heartbeat":
                self._json(200, {"heartbeat_ms": 60000})
                return
            m = re.fullmatch(r"v1/sampling-runs/([^/]+)/sample", route)
            if method == "POST" and m:
                self._json(200, fake.sample(m.group(1), token, json.loads(raw)))
                return
            raise Reply(404, "not_found", route)

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-request-id", f"req_{next(_request_ids)}")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

        def _json(self, status: int, body: Any) -> None:
            self._send(status, "application/json", json.dumps(body).encode())

        def _msgpack(self, status: int, body: Any) -> None:
            self._send(status, "application/msgpack", msgpack.packb(body, use_bin_type=True))

    return Handler


_request_ids = itertools.count(1)
