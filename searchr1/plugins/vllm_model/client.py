"""The HTTP calls to a vLLM OpenAI-compatible server, on one pooled
:class:`~searchr1.kit.http.HttpClient` (the HTTP helper every plugin shares).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from searchr1.kit.http import Channel, HttpClient, HttpError, RetryPolicy, accept_any, status_class
from searchr1.plugins.vllm_model.server import VllmServer, VllmServerDied
from searchr1.sdk import (
    RemoteConnectionLost,
    RemoteError,
    RemoteMalformed,
    RemoteRefused,
    SampledSequence,
    SamplingParams,
    UserError,
)


class VllmError(UserError, RuntimeError):
    """The vLLM server does not serve what this run needs (an adapter it refused or lost, no
    base model); the message says which server and what to check (exit code 2)."""


class VllmAdapterError(VllmError):
    """The server refused to load a LoRA adapter."""


class VllmClient:
    """One server's API. ``api_base`` is e.g. ``http://127.0.0.1:8000`` (no ``/v1``);
    ``label`` names the server in errors (default: by its address). ``server``: the process
    serving it when this run launched it (set once it is ready), so that a connection it
    refused or dropped because it died is reported as its death, with its log."""

    server: VllmServer | None = None

    def __init__(
        self,
        api_base: str,
        *,
        request_timeout_s: float,
        max_connections: int,
        api_key: str = "",
        label: str = "",
        launched_by_rank0: bool = False,
    ) -> None:
        #: on another rank of a torchrun job: rank 0 launched the server (and sees its end)
        self.launched_by_rank0 = launched_by_rank0
        self.api_base = api_base.rstrip("/").removesuffix("/v1")
        self.name = (
            f"{label} at {self.api_base}" if label else f"the vLLM server at {self.api_base}"
        )
        self.request_timeout_s = request_timeout_s
        self.channel = Channel(
            service=label or "the vLLM server",
            url=self.api_base,
            address="model.api_base (model.vllm.api_bases)",
            key="model.api_key" if api_key else "",
            timeout_s=request_timeout_s,
            timeout_setting="model.vllm.request_timeout_s",
            retries="no retries",
        )
        self._http = HttpClient(
            self.api_base,
            policy=RetryPolicy(max_retries=0, attempt_timeout_s=None),
            max_connections=max_connections,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=httpx.Timeout(self.request_timeout_s, connect=10.0),
            # A system-wide proxy setting must not capture a loopback or in-cluster server.
            trust_env=False,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # ------------------------------------------------------------------ requests

    async def _request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> httpx.Response:
        self.channel.announce()
        try:
            return await self._http.request(
                method, path, json=body, timeout=timeout, decide=accept_any
            )
        except HttpError as exc:
            operation = f"{method} {path}"
            error = self.channel.error(exc, operation)
            if isinstance(error, RemoteRefused | RemoteConnectionLost):
                if self.server is not None and await self.server.ended(within_s=2.0):
                    raise self.server.died(self.name, operation) from exc
                if self.launched_by_rank0:
                    raise VllmServerDied(
                        f"{self.name}, which rank 0 of this torchrun job launched, failed "
                        f"during {operation}: {error.summary}: it has ended, and rank 0's error "
                        f"says how (with the server's log). Rerun once the cause is fixed "
                        f"(searchr1 train --resume continues a run from its last checkpoint "
                        f"and launches new servers)"
                    ) from exc
            raise error from exc

    async def readiness(self) -> str:
        """``""`` when ``/health`` answers 200, else why not (a refused connection while
        the server starts or is down, the status it answers)."""
        try:
            response = await self._request("GET", "/health", timeout=5.0)
        except RemoteError as exc:
            return exc.summary
        return "" if response.status_code == 200 else f"/health answers {response.status_code}"

    async def healthy(self) -> bool:
        """True when ``/health`` answers 200 (False while the server starts or is down)."""
        return not await self.readiness()

    async def models(self) -> list[dict[str, Any]]:
        """The cards of ``GET /v1/models``: the base model and each loaded adapter."""
        response = await self._request("GET", "/v1/models")
        self._raise_for_status(response, "GET /v1/models")
        try:
            return list(response.json().get("data", []))
        except (ValueError, AttributeError) as exc:
            raise self.channel.failed(
                RemoteMalformed, "the model list is not JSON with a data list", "GET /v1/models"
            ) from exc

    async def load_adapter(self, name: str, path: str) -> None:
        """Load adapter ``name`` from ``path`` (as the server sees it), then check that the
        server lists it with that path: a load answered 200 that did not reach the model the
        server samples from raises :class:`VllmAdapterError`."""
        response = await self._request(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
        )
        if response.status_code != 200:
            raise VllmAdapterError(
                f"{self.name} refused LoRA adapter {name!r} from "
                f"{path!r} (HTTP {response.status_code}: {_error_text(response)}). Check that "
                f"it runs with --enable-lora, --max-lora-rank >= [lora] rank and "
                f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and that it can read that folder "
                f"(model.vllm.server_adapters_dir when it mounts the adapters elsewhere)"
            )
        cards = {str(c.get("id")): c for c in await self.models()}
        card = cards.get(name)
        if card is None or card.get("root", path) != path:
            serves = sorted(n for n, c in cards.items() if c.get("parent"))
            raise VllmAdapterError(
                f"{self.name} accepted LoRA adapter {name!r} from {path!r} but "
                + ("does not list it" if card is None else f"lists it from {card.get('root')!r}")
                + f" (its adapters: {serves or 'none'}), so it would sample other weights. "
                f"Is the address a load balancer over several vLLM replicas? Give each replica's "
                f"own address in model.vllm.api_bases"
            )

    async def unload_adapter(self, name: str) -> None:
        response = await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        self._raise_for_status(response, f"unloading LoRA adapter {name!r}")

    async def complete(
        self,
        model: str,
        prompt: Sequence[int],
        num_samples: int,
        params: SamplingParams,
        max_tokens: int,
    ) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt`` from adapter (or model) ``model``."""
        body = completion_body(model, prompt, num_samples, params, max_tokens)
        response = await self._request("POST", "/v1/completions", body)
        if response.status_code == 404:
            raise VllmAdapterError(
                f"{self.name} does not serve LoRA adapter {model!r} that this run loaded there "
                f"(HTTP 404: {_error_text(response)}). Was the server restarted, or is the "
                f"address a load balancer over several vLLM replicas? Give each replica's own "
                f"address in model.vllm.api_bases"
            )
        self._raise_for_status(response, "POST /v1/completions")
        try:
            payload = response.json()
            served = payload.get("model")
        except (ValueError, AttributeError) as exc:
            raise self.channel.failed(
                RemoteMalformed, "the completion is not a JSON object", "POST /v1/completions"
            ) from exc
        if served is not None and served != model:
            raise VllmAdapterError(
                f"{self.name} answered a request for LoRA adapter {model!r} with {served!r}: "
                f"those samples come from other weights than the trained ones"
            )
        try:
            return parse_choices(payload, num_samples)
        except ValueError as exc:
            raise self.channel.failed(RemoteMalformed, str(exc), "POST /v1/completions") from exc

    def _raise_for_status(self, response: httpx.Response, what: str) -> None:
        """An error status as the RemoteError of its class, with vLLM's own error text."""
        status = response.status_code
        if status >= 400:
            detail = f"HTTP {status}: {_error_text(response)}"
            raise self.channel.failed(status_class(status), detail, what, status)


def completion_body(
    model: str,
    prompt: Sequence[int],
    num_samples: int,
    params: SamplingParams,
    max_tokens: int,
) -> dict[str, Any]:
    """Every sampling parameter explicit: no server or model default may change the
    distribution the learner compares against."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "n": num_samples,
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.stop_strings:
        body["stop"] = list(params.stop_strings)
        body["include_stop_str_in_output"] = True
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def parse_choices(payload: dict[str, Any], num_samples: int) -> list[SampledSequence]:
    """The choices of a completions response, in index order, as ``SampledSequence`` s
    (ValueError for an answer that does not fit the request: the client's RemoteMalformed)."""
    choices = sorted(payload.get("choices", []), key=lambda c: c.get("index", 0))
    if len(choices) != num_samples:
        raise ValueError(f"vLLM returned {len(choices)} choices for n={num_samples}")
    out: list[SampledSequence] = []
    for choice in choices:
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:  # older servers: only the "token_id:N" strings
            ids = [int(str(t).rpartition(":")[2]) for t in lp.get("tokens") or []]
        if len(ids) != len(logprobs) or any(x is None for x in logprobs):
            raise ValueError(
                f"vLLM returned {len(ids)} tokens but {len(logprobs)} log-probs; is the "
                f"server older than the API this provider needs (return_token_ids, logprobs)?"
            )
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ValueError(f"vLLM ended a sample with finish_reason={reason!r}")
        out.append(
            SampledSequence(
                tokens=tuple(int(t) for t in ids),
                logprobs=tuple(float(x) for x in logprobs),
                stop_reason=reason,
            )
        )
    return out


def _error_text(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:500]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        return str(error.get("message", error))[:500]
    return str(error)[:500]
