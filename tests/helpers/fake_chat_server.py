"""A loopback fake of the OpenAI chat-completions API (``POST /v1/chat/completions``).

Checks ``Authorization: Bearer``, records every request body, and answers with a scripted
reply: :meth:`FakeChatServer.reply` queues one assistant message (content and/or tool calls,
with a ``finish_reason``) per call; without a queued reply it echoes a short content. Faults:
:meth:`FakeChatServer.fail` answers the next ``times`` requests with an HTTP status (and a
``Retry-After`` header), a body that is not JSON (``raw``), or only after ``delay`` seconds. ``connections`` counts the TCP connections it accepted (a
client that reuses its pool opens one).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "sk-fake-chat-abcdef123456"


class FakeChatServer:
    def __init__(self, api_key: str = API_KEY):
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self._replies: deque[dict[str, Any]] = deque()
        self._failures: deque[tuple[int, str, str, bytes | None, float]] = deque()
        self._lock = threading.Lock()
        self.connections = 0
        self._server = _CountingServer(("127.0.0.1", 0), _handler(self), self)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reply(
        self,
        content: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        finish_reason: str = "stop",
        reasoning: str | None = None,
    ) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:  # what vLLM's reasoning parsers return apart
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(tool_calls)
            ]
            finish_reason = "tool_calls"
        with self._lock:
            self._replies.append({"message": message, "finish_reason": finish_reason})

    def fail(
        self,
        status: int,
        times: int = 1,
        retry_after: str = "0",
        message: str = "",
        raw: bytes | None = None,
        delay: float = 0.0,
    ) -> None:
        """The next ``times`` requests get ``status`` (``message``: the error text; default
        "injected <status>"; ``raw``: this body instead of JSON), after ``delay`` seconds."""
        with self._lock:
            self._failures.extend([(status, retry_after, message, raw, delay)] * times)

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            scripted = self._replies.popleft() if self._replies else None
        if scripted is None:
            scripted = {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        n = int(body.get("n", 1))
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": i,
                    "message": scripted["message"],
                    "finish_reason": scripted["finish_reason"],
                }
                for i in range(n)
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


class _CountingServer(ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], handler: Any, fake: FakeChatServer):
        super().__init__(address, handler)
        self.fake = fake

    def get_request(self) -> Any:
        with self.fake._lock:
            self.fake.connections += 1
        return super().get_request()


def _handler(fake: FakeChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                return self._send(401, {"error": {"message": "Incorrect API key provided"}})
            with fake._lock:
                failure = fake._failures.popleft() if fake._failures else None
            if failure is not None:
                status, retry_after, message, raw_body, delay = failure
                time.sleep(delay)
                if raw_body is not None:
                    return self._send(status, None, retry_after, raw_body)
                error = {"error": {"message": message or f"injected {status}"}}
                return self._send(status, error, retry_after)
            self._send(200, fake._answer(json.loads(raw)))

        def _send(
            self, status: int, body: Any, retry_after: str = "", raw: bytes | None = None
        ) -> None:
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if retry_after:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
                pass

    return Handler
