"""``[model.vllm]``: where the vLLM server is and how the provider talks to it.

Read once per run by :meth:`~searchr1.plugins.vllm_model.provider.VllmModelProvider.from_config`
through :func:`searchr1.core.config_validate.plugin_settings` (unknown keys, types and ranges are
checked there).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class VllmSettings:
    #: several running servers (instead of api_base); metrics and errors name them server0,
    #: server1, ... in this order
    api_bases: tuple[str, ...] = ()
    #: servers to launch (with python), each on its own GPUs
    servers: int = field(default=1, metadata={"min": 1})
    #: the vLLM environment's Python that launches a server, e.g. ".venv-vllm/bin/python"; empty =
    #: use a running one
    python: str = ""
    #: extra flags of a launched server, e.g. ["--gpu-memory-utilization", "0.35"]
    server_args: tuple[str, ...] = ()
    #: the server's context; 0 = [rollout] max_trajectory_tokens
    max_model_len: int = field(default=0, metadata={"min": 0})
    #: where adapters are written for the server to read; empty = a private temporary folder
    #: (launched server only)
    adapters_dir: str = ""
    #: the same folder as the server sees it (another mount); empty = the same path
    server_adapters_dir: str = ""
    #: how long a server may take to be ready
    startup_timeout_s: float = field(default=900.0, metadata={"gt": 0})
    #: one completions request, or one adapter load, at most
    request_timeout_s: float = field(default=600.0, metadata={"gt": 0})
    #: the HTTP client's connection limit
    max_connections: int = field(default=64, metadata={"min": 1})


def settings_problems(s: VllmSettings, api_base: str) -> list[str]:
    """Problems that need more than one field (``api_base``: ``[model]``'s)."""
    return [
        *_server_problems(s, api_base),
        *_address_problems(s, api_base),
        *_running_server_problems(s, api_base),
    ]


def _server_problems(s: VllmSettings, api_base: str) -> list[str]:
    """Some server is named (api_base or api_bases, not both) or launched (python)."""
    problems: list[str] = []
    if not api_base and not s.api_bases and not s.python:
        problems.append(
            "[model.vllm]: set api_base (a running vLLM server, e.g. the compose `vllm` service "
            'at "http://vllm:8000"), api_bases (several) or python (the Python of a vLLM '
            'environment, e.g. ".venv-vllm/bin/python" made by scripts/make-vllm-venv.sh) to '
            "launch one"
        )
    if api_base and s.api_bases:
        problems.append(
            "model.api_base and model.vllm.api_bases are both set: list every server in "
            "api_bases and leave api_base empty"
        )
    return problems


def _address_problems(s: VllmSettings, api_base: str) -> list[str]:
    """Each running server's address is an http(s) URL, listed once."""
    named = [("model.api_base", api_base)]
    named += [(f"model.vllm.api_bases[{i}]", b) for i, b in enumerate(s.api_bases)]
    problems = [
        f"{key} = {base!r} must start with http:// or https://"
        for key, base in named
        if base and not base.startswith(("http://", "https://"))
    ]
    normalised = [base.rstrip("/").removesuffix("/v1") for base in s.api_bases]
    repeated = sorted({base for base in normalised if normalised.count(base) > 1})
    if repeated:
        problems.append(
            f"model.vllm.api_bases lists {', '.join(repeated)} more than once: each server once"
        )
    return problems


def _running_server_problems(s: VllmSettings, api_base: str) -> list[str]:
    """Running servers (that this run did not launch) are not launched as well, and read the
    trained adapter from a folder the run writes."""
    problems: list[str] = []
    if s.servers > 1 and (api_base or s.api_bases):
        problems.append(
            f"model.vllm.servers = {s.servers} launches servers, but api_base/api_bases name "
            f"running ones: list each running server in api_bases, or leave them empty to launch"
        )
    if (api_base or s.api_bases) and not s.adapters_dir:
        problems.append(
            "model.vllm.adapters_dir is empty: with api_base or api_bases (servers this run did "
            "not launch) the trained adapter must be written to a folder the servers can read; "
            "set adapters_dir (and server_adapters_dir when they mount it elsewhere, e.g. "
            '"/adapters")'
        )
    if s.server_adapters_dir and not s.adapters_dir:
        problems.append("model.vllm.server_adapters_dir needs model.vllm.adapters_dir as well")
    return problems
