"""A machine without its services: a loopback port nothing listens on, and the Hugging Face hub
out of reach with a real hub-cache layout of its own (for commands run as subprocesses, since
huggingface_hub reads ``HF_HOME`` and ``HF_ENDPOINT`` when it is imported)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

#: the commit every cached test model is filed under
COMMIT = "0" * 40


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go): a connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hub_out_of_reach(hf_home: Path, credentials: str = "") -> dict[str, str]:
    """``os.environ`` with a fresh cache ``hf_home`` and the hub at a closed loopback port
    (``credentials``: ``user:token`` in its address, as a mirror's may carry)."""
    login = f"{credentials}@" if credentials else ""
    endpoint = f"http://{login}127.0.0.1:{closed_port()}"
    return {**os.environ, "HF_HOME": str(hf_home), "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"}


def hub_cache_folder(hf_home: Path, repo_id: str) -> Path:
    """The folder the hub cache of ``hf_home`` keeps ``repo_id``'s files in
    (``hub/models--ORG--NAME/snapshots/COMMIT``, its ``refs/main`` naming it); fill it."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


def run_searchr1(*argv: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``searchr1 ARGV`` as its own process with ``env`` (from :func:`hub_out_of_reach`)."""
    return subprocess.run(
        [sys.executable, "-m", "searchr1.cli", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
