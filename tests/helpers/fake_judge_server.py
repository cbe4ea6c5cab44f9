"""A loopback fake of an LLM judge behind the OpenAI chat API (``POST /v1/chat/completions``).

It reads the prompt the judge sends (``docs/rewards.md``'s default: ``Golden answers: ...``
and ``Predicted answer: ...`` lines) and answers ``yes`` when every normalised token of the
prediction is in one golden answer's, else ``no``: a lenient grader, so "Saint-Exupéry" for
"Antoine de Saint-Exupéry" is right, unlike exact match. Every reply reports ``usage``
(prompt and completion tokens: words of the prompt, 1). Keys: any of ``keys`` in
``Authorization: Bearer``, else 401.

Faults, queued and consumed one per request (:meth:`FakeJudgeServer.fault`): ``("status",
code, retry_after)``, ``("hang", seconds)`` (answers after sleeping), ``("malformed",)`` (a
200 whose body is not the API's), ``("reply", text)`` (a verbatim reply, e.g. no verdict);
:meth:`FakeJudgeServer.limit_key` answers 429 to one key for good (its quota is gone).
``down = True`` answers 503 to everything. ``requests`` holds every body and the key used.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from searchr1.core.answers import normalize_answer

KEYS = ("sk-judge-first-0123456789", "sk-judge-second-9876543210")


def lenient_verdict(prompt: str) -> str:
    golden = re.search(r"^Golden answers: (.*)$", prompt, re.M)
    predicted = re.search(r"^Predicted answer: (.*)$", prompt, re.M)
    if golden is None or predicted is None:
        return "I cannot tell."
    words = set(normalize_answer(predicted.group(1)).split())
    goldens = [set(normalize_answer(g).split()) for g in golden.group(1).split("; ")]
    return "Yes." if words and any(words <= g for g in goldens) else "No."


class FakeJudgeServer:
    def __init__(self, keys: tuple[str, ...] = KEYS):
        self.keys = keys
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.down = False
        self.limited: set[str] = set()
        self._faults: deque[tuple[Any, ...]] = deque()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeJudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fault(self, *fault: Any, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([fault] * times)

    def limit_key(self, key: str) -> None:
        self.limited.add(key)

    def next_fault(self) -> tuple[Any, ...] | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def answer(self, key: str, body: dict[str, Any], text: str | None = None) -> dict[str, Any]:
        prompt = body["messages"][-1]["content"]
        with self._lock:
            self.requests.append((key, body))
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text or lenient_verdict(prompt)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 1},
        }


def _handler(fake: FakeJudgeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            key = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if key not in fake.keys:
                return self._send(401, {"error": {"message": "Incorrect API key provided"}})
            if fake.down:
                return self._send(503, {"error": {"message": "service unavailable"}})
            if key in fake.limited:
                return self._send(429, {"error": {"message": "quota exhausted"}}, "3600")
            fault = fake.next_fault()
            body = json.loads(raw)
            if fault is None:
                return self._send(200, fake.answer(key, body))
            if fault[0] == "status":
                return self._send(fault[1], {"error": {"message": "injected"}}, fault[2])
            if fault[0] == "hang":
                time.sleep(fault[1])
                return self._send(200, fake.answer(key, body))
            if fault[0] == "malformed":
                return self._send(200, {"unexpected": True})
            return self._send(200, fake.answer(key, body, fault[1]))

        def _send(self, status: int, body: Any, retry_after: str = "") -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout) before the answer

    return Handler
