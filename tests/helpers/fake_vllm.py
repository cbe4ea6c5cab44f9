"""A loopback HTTP server speaking the part of vLLM's API the ``vllm`` provider uses.

``/health``, ``/v1/models`` (the base model and each loaded adapter with its ``root``),
``/v1/load_lora_adapter`` (checks the folder holds a peft adapter), ``/v1/unload_lora_adapter``
and ``/v1/completions`` (404 for an adapter it has not loaded; the answer names the adapter
in ``model``, as vLLM does). Every completion and every adapter it loaded (``loads``, in
order) is recorded. Faults a test can switch on:

- ``refuse_loads``: a load answers 404 (the adapter folder is not there for this server);
- ``ignore_loads``: a load answers 200 but the server keeps serving what it had (the load
  never reached the sampler: a replica behind a balancer, or verl #7495);
- ``answer_as``: completions name another adapter than the one asked for;
- ``die_after_loads``: the first completion after that many loads kills the server (that
  request gets no answer, later ones find the port closed), as a crashed vLLM would.

``sample_tokens`` / ``logprobs_for`` choose what a completion returns (default: fixed tokens
with log-prob -1 each), so a test can hand out the learner's own log-probs, or shifted ones;
``sample_for(prompt, index)`` instead chooses each choice's tokens (a scripted policy), and
``finish_reason`` says why they end (:func:`scripted_policy`: the offline world's ideal
agent). ``port`` binds a given port (a server started again where a dead one was).

Run as a script with a vLLM server's command line (``fake_vllm.py -m vllm... --port N ...``)
it serves on that port until killed, as the server a provider launches; with
``$FAKE_VLLM_POLICY`` (a config file) it answers as :func:`scripted_policy`, and with
``$FAKE_VLLM_RECORD`` (a folder) it writes there what it saw: ``<port>.env`` (the names of
its environment) and ``<port>.loads`` (each adapter loaded, a line each); with
``$FAKE_VLLM_DIE_AFTER_LOADS`` it dies as ``die_after_loads`` says, then SIGKILLs itself.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLED = (5, 6, 7)


@dataclass(frozen=True)
class Completion:
    model: str
    prompt: tuple[int, ...]
    n: int


class FakeVllm(http.server.ThreadingHTTPServer):
    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.loaded: dict[str, str] = {}
        self.loads: list[str] = []
        self.max_model_len = 64
        self.die_after_loads: int | None = None
        self.dead = False
        self.sample_for: Callable[[list[int], int], list[int]] | None = None
        self.finish_reason = "length"
        self.record: Path | None = None
        self.completions: list[Completion] = []
        self.refuse_loads = False
        self.ignore_loads = False
        self.answer_as: str | None = None
        self.sample_tokens: tuple[int, ...] = SAMPLED
        self.logprobs_for: Callable[[list[int], list[int]], list[float]] = lambda _p, t: (
            [-1.0] * len(t)
        )
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a killed trainer) is no error of the fake's."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeVllm

    def _answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/health":
            self._answer(200, {})
            return
        cards: list[dict[str, Any]] = [{"id": "base", "max_model_len": self.server.max_model_len}]
        cards += [
            {"id": name, "root": path, "parent": "base"}
            for name, path in self.server.loaded.items()
        ]
        self._answer(200, {"object": "list", "data": cards})

    def do_POST(self) -> None:  # noqa: N802
        fake = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/load_lora_adapter":
            if fake.refuse_loads or not (Path(body["lora_path"]) / "adapter_config.json").is_file():
                self._answer(
                    404, {"error": {"message": f"No adapter found for {body['lora_path']}"}}
                )
                return
            if not fake.ignore_loads:
                fake.loaded[body["lora_name"]] = body["lora_path"]
                fake.loads.append(body["lora_name"])
                if fake.record is not None:
                    with open(fake.record / f"{fake.server_address[1]}.loads", "a") as out:
                        out.write(body["lora_name"] + "\n")
            self._answer(200, "Success")
            return
        if self.path == "/v1/unload_lora_adapter":
            if fake.loaded.pop(body["lora_name"], None) is None:
                self._answer(404, {"error": {"message": f"{body['lora_name']} not found"}})
                return
            self._answer(200, "Success")
            return
        if fake.die_after_loads is not None and len(fake.loads) >= fake.die_after_loads:
            fake.dead = True
            fake.shutdown()  # serve_forever runs in another thread
            fake.socket.close()  # later requests: connection refused
            self.close_connection = True  # this one: no answer
            return
        if body["model"] not in fake.loaded:
            self._answer(
                404, {"error": {"message": f"The model `{body['model']}` does not exist."}}
            )
            return
        with fake.lock:
            fake.completions.append(Completion(body["model"], tuple(body["prompt"]), body["n"]))
        prompt = list(body["prompt"])
        choices = []
        for i in range(body["n"]):
            tokens = list(fake.sample_for(prompt, i) if fake.sample_for else fake.sample_tokens)
            choices.append(
                {
                    "index": i,
                    "token_ids": tokens,
                    "logprobs": {"token_logprobs": fake.logprobs_for(prompt, tokens)},
                    "finish_reason": fake.finish_reason,
                }
            )
        self._answer(200, {"model": fake.answer_as or body["model"], "choices": choices})

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def fake_vllm_servers(
    count: int, ports: tuple[int, ...] = (), **attributes: Any
) -> Iterator[list[FakeVllm]]:
    """``count`` fake servers (on ``ports`` when given), each with ``attributes`` set and serving
    in its own thread until the block ends; one killed meanwhile (``dead``) is closed only."""
    servers = [FakeVllm(port) for port in (ports or (0,) * count)]
    for server in servers:
        for name, value in attributes.items():
            setattr(server, name, value)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield servers
    finally:
        for s in servers:
            if not s.dead:
                s.shutdown()
            s.server_close()
            s.server_close()


@asynccontextmanager
async def connected(config: Any) -> AsyncIterator[Any]:
    """A ``VllmModelProvider`` made and connected as a command does, in the running event
    loop (which owns its HTTP pools), disconnected and closed when the block ends."""
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    provider = VllmModelProvider.from_config(config)
    await provider.connect()
    try:
        yield provider
    finally:
        try:
            await provider.disconnect()
        finally:
            provider.close()


async def train_on(provider: Any, prompt: list[int], sampled: list[int]) -> dict[str, float]:
    """One ``forward_backward`` + ``optim_step`` of ``provider`` on ``sampled`` after ``prompt``
    (advantage 1): a new adapter version for the provider to publish."""
    from searchr1.core.types import AdamParams, Datum
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    tokens = prompt + list(sampled)
    pad = [0.0] * (len(prompt) - 1)
    datum = Datum(
        tuple(tokens[:-1]),
        tuple(tokens[1:]),
        tuple(pad + [-1.0] * len(sampled)),
        tuple(pad + [1.0] * len(sampled)),
    )
    loss = NamedLoss("importance_sampling", importance_sampling)
    queued = await provider.forward_backward([datum], loss)
    metrics = await provider.optim_step(AdamParams(learning_rate=1e-3))
    await queued
    return dict(metrics)


def scripted_policy(config_path: Path) -> Callable[[list[int], int], list[int]]:
    """Choice 0 of a request: the offline world's ideal agent's next turn after the prompt
    (search, then the answer it read); any other choice: answer "unknown". So a group's
    rewards differ and a step on them has a gradient."""
    from searchr1.core.config import load_config
    from searchr1.core.plugins import load_registry
    from searchr1.core.protocols import make_protocol
    from searchr1.kit.tokenizers import load_tokenizer
    from searchr1.plugins.offline_world.ideal_agent import ideal_agent_for

    registry = load_registry()
    config = load_config(str(config_path), registry=registry)
    tokenizer = load_tokenizer(config.model.base_model, config.assets, "model.base_model")
    protocol = make_protocol(config, tokenizer, registry)
    agent = ideal_agent_for(config, tokenizer, protocol)
    assert agent is not None
    wrong = protocol.assistant_turn_tokens(answer="unknown")
    lock = threading.Lock()  # a server answers from several threads

    def sample_for(prompt: list[int], index: int) -> list[int]:
        if index:
            return list(wrong)
        with lock:
            text = tokenizer.decode(prompt, skip_special_tokens=False)
            return list(protocol.encode(agent.next_turn(text)))

    return sample_for


def _serve_as_launched(argv: list[str]) -> None:
    import os
    import signal

    server = FakeVllm(int(argv[argv.index("--port") + 1]))
    server.max_model_len = int(argv[argv.index("--max-model-len") + 1])
    if os.environ.get("FAKE_VLLM_POLICY"):
        server.sample_for = scripted_policy(Path(os.environ["FAKE_VLLM_POLICY"]))
        server.finish_reason = "stop"
    if os.environ.get("FAKE_VLLM_DIE_AFTER_LOADS"):
        server.die_after_loads = int(os.environ["FAKE_VLLM_DIE_AFTER_LOADS"])
    if os.environ.get("FAKE_VLLM_RECORD"):
        server.record = Path(os.environ["FAKE_VLLM_RECORD"])
        names = "\n".join(sorted(os.environ))
        (server.record / f"{server.server_address[1]}.env").write_text(names + "\n")
    server.serve_forever()
    if server.dead:  # as the kernel's out-of-memory killer ends a server
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    import sys

    _serve_as_launched(sys.argv[1:])


def learner_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> Any:
    """The learner ``model``'s log-prob of each of ``tokens`` after ``prompt`` at
    ``temperature`` (a 1-D tensor): what a server sampling the same weights reports."""
    import torch

    from searchr1.kit.learner.learner import token_logprobs

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lp = token_logprobs(
            model, ids[:, :-1], torch.ones_like(ids[:, :-1]), ids[:, 1:], temperature
        )
    return lp[0, len(prompt) - 1 :]
