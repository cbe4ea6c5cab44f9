"""The ``vllm`` provider's failure paths, without vLLM: each ends in a clear error.

Real sockets on loopback play the broken servers (a closed port, a server that accepts and
never answers); a Python without vLLM plays a server that dies at start; ``/bin/sleep`` plays
a server that never gets ready (to check the process group is stopped). The working paths
against a real vLLM server are in ``tests/remote/test_vllm_provider.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import connected
from offline import closed_port
from vllm_env import offline_vllm_config

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError, RemoteRefused, RemoteTimeout
from searchr1.core.plugins import load_registry
from searchr1.core.types import SamplingParams
from searchr1.plugins.vllm_model.client import (
    VllmClient,
    completion_body,
    parse_choices,
)
from searchr1.plugins.vllm_model.server import VllmServer, VllmServerError, wait_ready


@pytest.fixture
def stalled_server() -> Iterator[str]:
    """Accepts connections, reads the request, never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def _config(api_base: str = "", **table: Any) -> Config:
    return Config(plugins={"model.vllm": table}, assets=load_registry().assets).replace(
        model={"provider": "vllm", "base_model": "builtin:tiny-random", "api_base": api_base},
        lora={"rank": 8, "alpha": 16, "dropout": 0.0},
    )


def test_a_server_that_is_down_is_named_with_its_address() -> None:
    client = VllmClient(f"http://127.0.0.1:{closed_port()}", request_timeout_s=5, max_connections=4)

    async def scenario() -> None:
        try:
            assert await client.healthy() is False
            with pytest.raises(
                RemoteRefused, match=r"connection refused.*Is the server running on port"
            ):
                await client.complete("m", [1, 2], 1, SamplingParams(max_tokens=4), 4)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_server_that_never_answers_times_out_naming_the_setting(stalled_server: str) -> None:
    client = VllmClient(stalled_server, request_timeout_s=0.5, max_connections=4)

    async def scenario() -> None:
        try:
            t0 = time.monotonic()
            with pytest.raises(
                RemoteTimeout, match=r"within 0.5 s: raise model.vllm.request_timeout_s"
            ):
                await client.complete("m", [1, 2], 1, SamplingParams(max_tokens=4), 4)
            assert time.monotonic() - t0 < 5
        finally:
            await client.aclose()

    asyncio.run(scenario())


async def _connect(cfg: Config) -> None:
    """Make and connect the provider as a command does (one event loop), then close it."""
    async with connected(cfg):
        pass


def test_a_server_that_is_not_up_fails_the_start_after_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Said at once (a server started by hand binds its port only once its model is loaded,
    so the run waits), with the reason, then the timeout's error with the reason too."""
    port = closed_port()
    cfg = _config(
        api_base=f"http://127.0.0.1:{port}",
        adapters_dir=str(tmp_path / "adapters"),
        startup_timeout_s=1,
    )
    refused = "connection refused (nothing listens there)"
    with pytest.raises(
        VllmServerError,
        match=rf"not ready after 1 s \(model.vllm.startup_timeout_s\): {re.escape(refused)}",
    ):
        asyncio.run(_connect(cfg))
    assert (
        f"searchr1: warning: the vLLM server at http://127.0.0.1:{port} is not ready: {refused}; "
        f"waiting up to 1 s (model.vllm.startup_timeout_s) for it, Ctrl-C stops"
    ) in capsys.readouterr().err


def test_a_launched_server_that_dies_shows_its_last_log_lines() -> None:
    """The trainer's own Python has no vLLM: the launched server exits at once."""
    with pytest.raises(VllmServerError) as info:
        asyncio.run(_connect(_config(python=sys.executable, startup_timeout_s=120)))
    message = str(info.value)
    assert "exited with code 1 before it was ready" in message
    assert "No module named 'vllm'" in message  # the log's last lines
    log_path = Path(message.split("(log: ", 1)[1].split(")", 1)[0])
    assert log_path.is_file()  # kept: the error names it
    log_path.unlink()


def test_train_whose_server_dies_at_start_exits_2_with_its_log_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line's view of the case above: a plain message and exit code 2."""
    from searchr1.cli.main import main as cli

    config = offline_vllm_config(tmp_path, None, python=sys.executable)
    assert cli(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "the vLLM server exited with code 1 before it was ready (log: " in err
    assert "No module named 'vllm'" in err
    Path(err.split("(log: ", 1)[1].split(")", 1)[0]).unlink()


def test_settings_need_a_server_or_a_python() -> None:
    from searchr1.plugins.vllm_model.provider import VllmModelProvider

    with pytest.raises(ConfigError, match=r"set api_base .* or python .*make-vllm-venv.sh"):
        VllmModelProvider.from_config(_config())
    with pytest.raises(ConfigError, match="adapters_dir is empty"):
        VllmModelProvider.from_config(_config(api_base="http://vllm:8000"))


def test_a_python_that_is_not_there_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(
        VllmServerError, match=r"'/nope/python' is not an executable .*make-vllm-venv"
    ):
        VllmServer.launch(["/nope/python", "-m", "vllm"], tmp_path / "server.log")


async def _never() -> str:
    return "still loading"


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    """A server that never gets ready: the wait times out, stop() ends it and its children."""
    script = tmp_path / "fake_server.sh"
    script.write_text("#!/bin/sh\nsleep 300 &\nsleep 300\n")
    script.chmod(0o755)
    server = VllmServer.launch([str(script)], tmp_path / "server.log")
    with pytest.raises(VllmServerError, match="not ready after 0.5 s"):
        asyncio.run(wait_ready(_never, where="fake", timeout_s=0.5, server=server, poll_s=0.1))
    server.stop(grace_s=5)
    assert server.exited() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)


def test_a_long_start_says_how_long_and_what_the_server_is_doing(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    script = tmp_path / "fake_server.sh"
    script.write_text(
        "#!/bin/sh\necho 'starting up'\necho 'Loading weights took 41 s'\nsleep 300\n"
    )
    script.chmod(0o755)
    server = VllmServer.launch([str(script)], tmp_path / "server.log")
    try:
        with capture_logs() as logs, pytest.raises(VllmServerError, match="not ready after 1.5 s"):
            asyncio.run(
                wait_ready(
                    _never,
                    where="http://x",
                    timeout_s=1.5,
                    server=server,
                    poll_s=0.05,
                    note_every_s=0.5,
                )
            )
    finally:
        server.stop(grace_s=5)
    notes = [e for e in logs if e["event"] == "vllm_server_starting"]
    waited = [n["waited_s"] for n in notes]
    assert waited == sorted(waited) and waited[-1] <= 2
    assert 2 <= len(notes) <= 3  # at 0.5, 1.0 (and 1.5) s, not on every poll
    assert notes[-1]["log_line"] == "Loading weights took 41 s"
    assert notes[-1]["timeout_s"] == 1.5 and notes[-1]["api_base"] == "http://x"
    assert notes[-1]["why"] == "still loading"
    assert not [e for e in logs if e["event"] == "vllm_server_not_ready"]  # launched: expected


def test_a_killed_trainer_takes_its_server_down(tmp_path: Path) -> None:
    """SIGKILL leaves no time to clean up: the parent-death signal stops the server."""
    pid_file = tmp_path / "server.pid"
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import pathlib, time
                from searchr1.plugins.vllm_model.server import VllmServer
                s = VllmServer.launch(["/bin/sleep", "300"], pathlib.Path({str(tmp_path / "log")!r}))
                pathlib.Path({str(pid_file)!r}).write_text(str(s.process.pid))
                time.sleep(300)
                """
            ),
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 10
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid)
    finally:
        trainer.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_requests_set_every_sampling_parameter_and_parse_back() -> None:
    params = SamplingParams(
        max_tokens=9,
        temperature=0.7,
        top_p=0.9,
        stop_strings=("</search>",),
        stop_token_ids=(2,),
        seed=5,
    )
    body = completion_body("adapter-1", [3, 4], 8, params, 7)
    assert body["model"] == "adapter-1" and body["prompt"] == [3, 4] and body["n"] == 8
    assert body["max_tokens"] == 7 and body["seed"] == 5
    assert body["stop"] == ["</search>"] and body["include_stop_str_in_output"] is True
    assert body["stop_token_ids"] == [2] and body["logprobs"] == 0
    # No server or model default can change the distribution.
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (-1, 0.0, 1.0)
    payload = {
        "choices": [
            {
                "index": 1,
                "finish_reason": "length",
                "token_ids": None,
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:8"],
                    "token_logprobs": [-0.5, -1.0],
                },
            },
            {
                "index": 0,
                "finish_reason": "stop",
                "token_ids": [5],
                "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.25]},
            },
        ]
    }
    first, second = parse_choices(payload, 2)
    assert first.tokens == (5,) and first.stop_reason == "stop" and first.logprobs == (-0.25,)
    assert second.tokens == (7, 8) and second.stop_reason == "length"


@pytest.mark.slow
def test_sigterm_while_the_server_starts_stops_it_and_exits(tmp_path: Path) -> None:
    """A launched server that is still loading when the trainer gets SIGTERM is stopped."""
    fake = tmp_path / "fake_python"
    pid_file = tmp_path / "server.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    fake.chmod(0o755)
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import asyncio
                from searchr1.core.config_schema import Config
                from searchr1.core.plugins import load_registry
                from searchr1.plugins.vllm_model.provider import VllmModelProvider
                cfg = Config(
                    plugins={{"model.vllm": {{"python": {str(fake)!r}}}}},
                    assets=load_registry().assets,
                ).replace(
                    model={{"provider": "vllm", "base_model": "builtin:tiny-random"}},
                    lora={{"rank": 8, "alpha": 16}},
                )
                asyncio.run(VllmModelProvider.from_config(cfg).connect())
                """
            ),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the kept server log lands here
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        trainer.send_signal(15)
        assert trainer.wait(timeout=60) == 128 + 15
        assert not _alive(server_pid)
    finally:
        trainer.kill()


def test_model_api_base_and_key_reach_the_server(tmp_path: Path) -> None:
    """``[model] api_base`` is the server when ``[model.vllm]`` lists no api_bases;
    ``[model] api_key`` goes as a bearer token (a server started with ``--api-key``). A loopback server records what
    arrives and answers ``/health`` with 503, so the start times out naming the address."""
    import http.server

    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.headers.get("Authorization"))
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cfg = _config(adapters_dir=str(tmp_path / "adapters"), startup_timeout_s=1)
        cfg = cfg.replace(model={"api_base": address, "api_key": "sk-test-key"})
        with pytest.raises(VllmServerError, match=f"server at {address} was not ready") as info:
            asyncio.run(_connect(cfg))
        assert "sk-test-key" not in str(info.value)
        assert seen and set(seen) == {"Bearer sk-test-key"}
    finally:
        server.shutdown()
        server.server_close()
