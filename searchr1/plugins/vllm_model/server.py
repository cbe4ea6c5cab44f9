"""Launch, wait for and stop a local vLLM OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from searchr1.sdk import EXIT_ENVIRONMENT_DOWN, UserError, get_logger, warn

log = get_logger()

#: LoRA ranks vLLM accepts for ``--max-lora-rank``.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


#: what torchrun tells its workers, none of which a launched server may inherit
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


class VllmServerError(UserError, RuntimeError):
    """The vLLM server could not be started or did not become ready; the message says why,
    with the server log's last lines when there is one (exit code 2)."""


class VllmServerDied(VllmServerError):
    """A server this run launched ended while the run used it (exit code 3: the run resumes
    from its last checkpoint with a new server)."""

    exit_code = EXIT_ENVIRONMENT_DOWN


def free_port() -> int:
    """A TCP port free on loopback right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def max_lora_rank_flag(rank: int) -> int:
    """The smallest rank vLLM accepts for ``--max-lora-rank`` that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora.rank = {rank} is larger than vLLM supports ({VLLM_LORA_RANKS[-1]})")


def server_command(
    python: str,
    *,
    model: str,
    port: int,
    dtype: str,
    max_model_len: int,
    lora_rank: int,
    seed: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The full command line of a launched server (``extra`` last, so it can override)."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enable-lora",
        "--max-lora-rank",
        str(max_lora_rank_flag(lora_rank)),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--seed",
        str(seed),
        "--disable-uvicorn-access-log",
        # A seeded request whose prompt is prefilled in chunks crashes vLLM-CPU's engine
        # ("CPU Generator does not use offset" when the chunk's sampled token is discarded);
        # whole prompts only, and a token budget that always holds one.
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(max(max_model_len, 8192)),
        *extra,
    ]


def tensor_parallel_size(server_args: Sequence[str]) -> int:
    """``--tensor-parallel-size N`` (or ``-tp N``, ``--tensor-parallel-size=N``) in a
    server's extra flags; 1 when absent."""
    size = 1
    for i, arg in enumerate(server_args):
        name, eq, value = arg.partition("=")
        if name in ("--tensor-parallel-size", "-tp"):
            value = value if eq else (server_args[i + 1] if i + 1 < len(server_args) else "")
            try:
                size = int(value)
            except ValueError:
                raise VllmServerError(
                    f"model.vllm.server_args: {name} needs a whole number, got {value!r}"
                ) from None
    return size


def server_gpus(
    servers: int, server_args: Sequence[str], visible: Sequence[str], *, learners: int = 0
) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each of ``servers`` launched servers: consecutive slices of
    the tensor-parallel size out of ``visible`` (the trainer's GPUs). In one process
    (``learners`` 0) the learner shares the first with server 0, as it does with a single
    server; under torchrun the first ``learners`` GPUs are this machine's ranks'
    (``cuda:LOCAL_RANK``) and the servers get the ones after them. Empty strings when there
    are no GPUs (vLLM-CPU) or one server in one process (it sees what the trainer sees)."""
    if not visible or (servers == 1 and not learners):
        return [""] * servers
    tp = tensor_parallel_size(server_args)
    free = list(visible[learners:])
    if servers * tp > len(free):
        ranks = f", the torchrun ranks train on the first {learners}" if learners else ""
        raise VllmServerError(
            f"model.vllm.servers = {servers} with tensor-parallel size {tp} needs "
            f"{servers * tp} GPUs, {len(visible)} visible ({','.join(visible)}){ranks}: launch "
            f"fewer servers, lower --tensor-parallel-size in model.vllm.server_args, run fewer "
            f"ranks, or run the servers yourself and list them in model.vllm.api_bases"
        )
    return [",".join(free[k * tp : (k + 1) * tp]) for k in range(servers)]


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every CUDA
    device torch sees (none on a CPU host)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when the trainer dies. libc is
    resolved here, in the parent, so the child runs no import between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return preexec


class VllmServer:
    """One launched server process and its log file."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, command: list[str]):
        self.process = process
        self.log_path = log_path
        self.command = command

    @classmethod
    def launch(
        cls, command: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> VllmServer:
        """Start ``command`` with its output in ``log_path``; ``env`` is added to the
        trainer's environment (e.g. the server's ``CUDA_VISIBLE_DEVICES``)."""
        python = command[0]
        if "/" not in python:  # a bare name such as "python3": look it up on PATH
            python = shutil.which(python) or python
            command = [python, *command[1:]]
        if not (Path(python).is_file() and os.access(python, os.X_OK)):
            raise VllmServerError(
                f"model.vllm.python = {python!r} is not an executable file; create the vLLM "
                f"environment with scripts/make-vllm-venv.sh (then python = "
                f'".venv-vllm/bin/python") or set model.api_base to a running server'
            )
        server_env = {**os.environ, **(env or {})}
        server_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # The trainer's venv must not leak into vLLM's (its own torch and transformers), nor
        # its torchrun job (vLLM sets up torch.distributed of its own from these variables).
        for name in ("PYTHONPATH", "VIRTUAL_ENV", *TORCHRUN_ENV):
            server_env.pop(name, None)
        for name in [n for n in server_env if n.startswith("TORCHELASTIC_")]:
            server_env.pop(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env,
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
        log.info("vllm_server_launched", pid=process.pid, log=str(log_path), command=command)
        return cls(process, log_path, command)

    def exited(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return self.process.poll()

    async def ended(self, within_s: float) -> bool:
        """Whether the process has ended, waiting up to ``within_s`` for it: a connection it
        dropped as it died may be seen before its exit is."""
        deadline = time.monotonic() + within_s
        while self.process.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def ending(self) -> str:
        """How the ended process ended, for a message."""
        code = self.process.returncode
        if code is None or code >= 0:
            return f"exited with code {code}"
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        why = (
            " (the kernel's out-of-memory killer sends it: `dmesg` says so when it did)"
            if -code == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{why}"

    def died(self, name: str, during: str) -> VllmServerDied:
        """The error of server ``name`` (``the vLLM server at http://...``), ended while
        ``during`` (``POST /v1/completions``) ran."""
        return VllmServerDied(
            f"{name}, which this run launched (pid {self.process.pid}), {self.ending()} "
            f"during {during}; its log: {self.log_path}, last lines:\n{self.log_tail()}\n"
            f"Rerun once the cause is fixed (searchr1 train --resume continues a run from its "
            f"last checkpoint and launches a new server)"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group (vLLM then stops its engine processes), wait up
        to ``grace_s``, then SIGKILL whatever is left."""
        if self.process.poll() is not None:
            return
        pgid = self.process.pid  # its own session: the group id is its pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("vllm_server_kill", pid=pgid, after_s=grace_s)
            _signal_group(pgid, signal.SIGKILL)
            self.process.wait(timeout=10)
        # Engine processes may outlive the API server by a moment; leave none behind.
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        log.info("vllm_server_stopped", pid=pgid, returncode=self.process.returncode)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def wait_ready(
    not_ready: Callable[[], Awaitable[str]],
    *,
    where: str,
    timeout_s: float,
    server: VllmServer | None = None,
    poll_s: float = 1.0,
    note_every_s: float = 15.0,
) -> float:
    """Poll ``not_ready`` (why the server is not ready, ``""`` once it is) and return the
    seconds waited. Raises :class:`VllmServerError` when ``server`` (a launched one) exits or
    ``timeout_s`` passes, with the reason and the server log's last lines when there is one.
    A server this run did not launch that is not ready at once is warned about, and every
    ``note_every_s`` of waiting logs a ``vllm_server_starting`` event (the reason, a launched
    server's last log line): a large model takes minutes to load, and the wait must not look
    like a hang."""
    t0 = time.monotonic()
    next_note, warned = note_every_s, False
    while True:
        if server is not None and server.exited() is not None:
            raise VllmServerError(
                f"the vLLM server {server.ending()} before it was ready "
                f"(log: {server.log_path}); its last lines:\n{server.log_tail()}"
            )
        why = await not_ready()
        waited = time.monotonic() - t0
        if not why:
            return waited
        if server is None and not warned:
            warned = True
            warn(
                "vllm_server_not_ready",
                f"the vLLM server at {where} is not ready: {why}; waiting up to "
                f"{timeout_s:g} s (model.vllm.startup_timeout_s) for it, Ctrl-C stops",
            )
        if waited >= next_note:
            next_note += note_every_s
            line = server.log_tail(1)[-200:] if server is not None else ""
            log.info(
                "vllm_server_starting",
                api_base=where,
                waited_s=round(waited),
                timeout_s=timeout_s,
                why=why,
                **({"log_line": line} if line else {}),
            )
        if waited > timeout_s:
            tail = f"; its last log lines:\n{server.log_tail()}" if server is not None else ""
            raise VllmServerError(
                f"the vLLM server at {where} was not ready after {timeout_s:g} s "
                f"(model.vllm.startup_timeout_s): {why}{tail}"
            )
        await asyncio.sleep(poll_s)
