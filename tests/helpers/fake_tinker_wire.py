"""The wire side of the fake Tinker service: protobuf bodies and the HTTP handler.

``forward_backward`` requests arrive as ``tinker.proto`` ``ForwardBackwardRequest`` messages;
``ForwardBackwardOutput`` and ``SampleResponse`` answers leave as protobuf (the SDK asks for
them with ``Accept: application/x-protobuf``); everything else is JSON. Parsed and written
with the SDK's own protobuf module.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import numpy as np


class Reply(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------------- protobuf


def datum(msg: Any) -> Any:
    """A ``tinker.proto`` Datum as searchr1's (dense tensors, encoded-text chunks only)."""
    from searchr1.core.types import Datum

    tokens: list[int] = []
    for chunk in msg.model_input:
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    inputs = {name: tensor(t) for name, t in msg.loss_fn_inputs.items()}
    return Datum(
        tuple(tokens),
        tuple(int(t) for t in inputs["target_tokens"]),
        tuple(float(x) for x in inputs["logprobs"]),
        tuple(float(x) for x in inputs["advantages"]),
    )


def tensor(msg: Any) -> np.ndarray:
    from tinker.proto import tinker_public_pb2 as pb

    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}[msg.dtype]
    if msg.HasField("sparse_csr"):
        raise ValueError("the fake takes dense tensors only")
    return np.frombuffer(msg.dense, dtype=dtype)


def forward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` proto: one ArrayRecord with per-datum ``logprobs``."""
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = out.loss_fn_outputs.add()
    record.num_datums = len(logprobs)
    field_ = record.fields["logprobs"]
    field_.dtype = pb.DTYPE_FLOAT32
    sizes = [0] + [lp.nbytes for lp in logprobs]
    field_.offsets = np.cumsum(sizes, dtype=np.int64).tobytes()
    field_.data = b"".join(np.ascontiguousarray(lp, dtype="<f4").tobytes() for lp in logprobs)
    return out.SerializeToString()


def sample_response(seqs: list[Any]) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    out = pb.SampleResponse()
    for s in seqs:
        seq = out.sequences.add()
        seq.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
        seq.stop_reason = (
            pb.STOP_REASON_LENGTH if s.stop_reason == "length" else pb.STOP_REASON_STOP
        )
    return out.SerializeToString()


# ---------------------------------------------------------------------- HTTP


def handler_for(fake: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            self._start = time.monotonic()
            self._method, self._path = method, urlsplit(self.path).path
            self._route(method, self._path)

        def _route(self, method: str, path: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake._bump(f"{method} {path}")
            fault = fake.take_fault(method, path)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            try:
                if fault is not None and fault.status:
                    raise Reply(fault.status, f"injected HTTP {fault.status}")
                if not path.startswith("/api/v1/"):
                    raise Reply(404, path)
                if path == "/api/v1/forward_backward":
                    if self.headers.get("X-API-Key") != fake.api_key:
                        raise Reply(401, "Invalid API key")
                    encoding = self.headers.get("Content-Encoding", "")
                    answer = fake.forward_backward(raw, encoding)
                else:
                    body = json.loads(raw) if raw else {}
                    answer = fake.handle(path, body, self.headers)
                if isinstance(answer, bytes):
                    self._send(200, "application/x-protobuf", answer)
                else:
                    self._send(200, "application/json", json.dumps(answer).encode())
            except Reply as reply:
                error = {"error": reply.message, "message": reply.message}
                self._send(reply.status, "application/json", json.dumps(error).encode())
            except Exception as exc:  # a bug in the fake, or a request the SDK models reject
                error = {"error": f"{type(exc).__name__}: {exc}"}
                self._send(400, "application/json", json.dumps(error).encode())

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            # Logged before the answer leaves, so a client that got it finds it in the log.
            fake.log_request(self._method, self._path, self._start, time.monotonic())
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

    return Handler
