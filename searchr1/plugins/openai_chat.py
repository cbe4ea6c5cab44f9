"""``openai_chat``: a sampling-only model provider over an OpenAI-compatible chat API.

For evaluating hosted models (TaoToken's ``{api_base}/v1/chat/completions``, a vLLM server, any
OpenAI-compatible gateway) with the same rollout, protocol and reward as training. Chosen by
``[model] provider = "openai_chat"``; ``api_base`` and ``api_key`` as for the other providers,
``base_model`` names the model (and its tokenizer). Training calls raise
:class:`TrainingNotSupported`.

How a text-level API meets the token-level contract (the honest version):

* **Prompt.** The rollout hands over prompt *tokens*. They are decoded with the local tokenizer
  (``[model.openai_chat] tokenizer``, default ``base_model``) and the ChatML text
  (``<|im_start|>role\\n...<|im_end|>``, what Qwen chat templates render) is parsed back into
  ``messages``: the ``# Tools`` block of the system turn becomes ``tools``, assistant
  ``<tool_call>`` JSON becomes ``tool_calls``, ``<tool_response>`` blocks become ``role: tool``
  messages. A prompt without ChatML markers is sent as one user message. So the server's own
  chat template renders the conversation; it sees what the local template would have shown
  the model only when both templates agree (true for the model family the tokenizer belongs to).
* **Continuing an assistant message.** The ``tags`` protocol writes search results *inside*
  the running assistant message and lets the model continue it. Plain chat completions cannot
  continue a message; vLLM can (``continue_final_message``), which ``[model.openai_chat]
  continue_final_message = true`` turns on. Without it such a prompt raises a clear error:
  use ``rollout.protocol = "tool_calls"`` (a real tool-calling conversation) instead.
* **Output.** Each choice is rendered back into the text the local sampler would have produced
  -- content, then the first tool call as ``<tool_call>\\n{json}\\n</tool_call>`` -- and
  encoded with the local tokenizer. Chat APIs drop the stop string that ended a sample; it is
  restored when it closes a tag the text left open (``</search>``, ``</answer>``), or the server
  is asked to keep it (vLLM: ``include_stop_str_in_output = true``). A sample that ended on its
  own gets the end-of-message token (``<|im_end|>``) the local sampler would have kept.
* **Log-probs are not available** at the local-token level (the server's tokens are not the
  local tokenizer's): every returned log-prob is 0.0 and :attr:`OpenAIChatProvider.
  logprobs_available` is False. Nothing in evaluation reads them; training is refused anyway.

Transient failures (429, 5xx, timeouts, connection errors) are retried ``max_retries`` times
with exponential backoff (``Retry-After`` honoured); 401/403 raise "<KEY VARIABLE> was rejected".
"""

from __future__ import annotations

import asyncio
import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from searchr1.core.config import plugin_settings
from searchr1.core.errors import UserError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.logs import redact_text
from searchr1.core.search.retry import parse_retry_after
from searchr1.core.types import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    LossFn,
    SampledSequence,
    SamplingParams,
    StopReason,
    Tokenizer,
)

if TYPE_CHECKING:
    from searchr1.core.config import Config

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ChatAuthError(UserError):
    """The chat API rejected the key."""


class ChatServiceError(RuntimeError):
    """A chat request failed after retries, or the server answered something unusable."""


class TrainingNotSupported(UserError):
    """openai_chat only samples."""


@dataclass(frozen=True)
class ChatSettings:
    """``[model.openai_chat]`` (all optional)."""

    #: model name sent to the API; empty = [model] base_model
    model: str = ""
    #: local tokenizer (folder, hub id or builtin:); empty = [model] base_model
    tokenizer: str = ""
    timeout_seconds: float = field(default=120.0, metadata={"gt": 0.0})
    max_retries: int = field(default=3, metadata={"min": 0})
    retry_backoff_seconds: float = field(default=1.0, metadata={"min": 0.0})
    max_concurrency: int = field(default=16, metadata={"min": 1})
    #: vLLM extension: continue a partial assistant message (needed by the tags protocol)
    continue_final_message: bool = False
    #: vLLM extension: keep the stop string in the returned text
    include_stop_str_in_output: bool = False


# --------------------------------------------------------------------------- ChatML <-> messages

_SEGMENT_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(<\|im_end\|>\n?|\Z)", re.DOTALL)
_TOOLS_RE = re.compile(r"\A(.*?)(?:\n\n)?# Tools\n.*?<tools>\n(.*?)\n</tools>", re.DOTALL)
_CALL_RE = re.compile(r"\n?<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_RESPONSE_RE = re.compile(r"\n?<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@dataclass
class Conversation:
    """A prompt read back into chat form; ``partial`` is the text of an assistant message
    that is still open (``""`` for a plain generation prompt, None when there is none)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    partial: str | None


def parse_chatml(text: str) -> Conversation:
    """Split rendered ChatML back into messages, tools and an open assistant message."""
    if "<|im_start|>" not in text:
        return Conversation([{"role": "user", "content": text}], [], None)
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    pending_calls: list[str] = []
    partial: str | None = None
    for m in _SEGMENT_RE.finditer(text):
        role, content, closed = m.group(1), m.group(2), bool(m.group(3))
        if role == "assistant" and not closed:
            partial = content
            break
        if role == "system":
            found = _TOOLS_RE.match(content)
            if found:
                tools = [json.loads(line) for line in found.group(2).splitlines() if line.strip()]
                content = found.group(1)
            if content.strip():
                messages.append({"role": "system", "content": content})
        elif role == "assistant":
            calls = []
            for body in _CALL_RE.findall(content):
                call = json.loads(body)
                args = call.get("arguments", {})
                call_id = f"call_{len(pending_calls) + len(calls)}"
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": call.get("name", ""),
                            "arguments": args if isinstance(args, str) else json.dumps(args),
                        },
                    }
                )
            rest = _CALL_RE.sub("", content).strip()
            message: dict[str, Any] = {"role": "assistant", "content": rest or None}
            if calls:
                message["tool_calls"] = calls
                pending_calls = [c["id"] for c in calls]
            messages.append(message)
        elif (
            role == "user"
            and _RESPONSE_RE.sub("", content).strip() == ""
            and "<tool_response>" in content
        ):
            for i, body in enumerate(_RESPONSE_RE.findall(content)):
                call_id = pending_calls[i] if i < len(pending_calls) else f"call_{i}"
                messages.append({"role": "tool", "tool_call_id": call_id, "content": body})
        else:
            messages.append({"role": role, "content": content})
    return Conversation(messages, tools, partial)


def render_choice(
    message: Mapping[str, Any],
    finish_reason: str | None,
    params: SamplingParams,
    end_of_message: str,
    stop_kept: bool,
) -> tuple[str, StopReason]:
    """The text the local sampler would have produced for one chat choice."""
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if calls:
        if "</tool_call>" in params.stop_strings:
            calls = calls[:1]  # sampling would have stopped after the first call
        parts = [content] if content else []
        for call in calls:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            parts.append(
                f'<tool_call>\n{{"name": "{fn.get("name", "")}", "arguments": {args_text}}}\n</tool_call>'
            )
        return "\n".join(parts), "stop"
    if finish_reason == "length":
        return content, "length"
    if stop_kept and any(content.endswith(s) for s in params.stop_strings):
        return content, "stop"
    for stop in params.stop_strings:
        tag = re.fullmatch(r"</([^<>/\s]+)>", stop)
        if tag and content.count(f"<{tag.group(1)}>") > content.count(stop):
            return content + stop, "stop"
    return content + end_of_message, "stop"


# --------------------------------------------------------------------------- provider


class OpenAIChatProvider:
    """Samples through ``POST {api_base}/v1/chat/completions``; cannot train."""

    logprobs_available = False

    def __init__(
        self,
        *,
        api_base: str,
        api_key: str,
        model: str,
        tokenizer: Tokenizer,
        settings: ChatSettings,
        key_name: str = "model.api_key",
    ):
        base = api_base.rstrip("/")
        self.url = (
            f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"
        )
        self._api_key = api_key
        self.model = model
        self._tokenizer = tokenizer
        self._settings = settings
        self._key_name = key_name
        self._semaphores: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_config(cls, config: Config) -> OpenAIChatProvider:
        from searchr1.core.tokenizers import provider_tokenizer
        from searchr1.plugins.remote_model.settings import api_key_variable

        def needs_a_server(_: ChatSettings) -> list[str]:
            if config.model.api_base.strip():
                return []
            return [
                "model.api_base is empty; provider 'openai_chat' needs the server URL "
                "(TaoToken: https://taotoken.net/api, vLLM: http://host:8000)"
            ]

        settings = plugin_settings(config, "model", "openai_chat", ChatSettings, needs_a_server)
        return cls(
            api_base=config.model.api_base.strip(),
            api_key=config.model.api_key,
            model=settings.model or config.model.base_model,
            tokenizer=provider_tokenizer(config, "openai_chat", settings.tokenizer),
            settings=settings,
            key_name=api_key_variable(config),
        )

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def _end_of_message(self, params: SamplingParams) -> str:
        texts = [
            self._tokenizer.decode([t], skip_special_tokens=False) for t in params.stop_token_ids
        ]
        return next((t for t in texts if t == "<|im_end|>"), texts[0] if texts else "")

    def _body(self, prompt_tokens: Sequence[int], n: int, params: SamplingParams) -> dict[str, Any]:
        text = self._tokenizer.decode(list(prompt_tokens), skip_special_tokens=False)
        conv = parse_chatml(text)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": conv.messages,
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop_strings:
            body["stop"] = list(params.stop_strings)[:4]  # OpenAI accepts at most 4
        if params.seed is not None:
            body["seed"] = params.seed
        if conv.tools:
            body["tools"] = conv.tools
        if self._settings.include_stop_str_in_output:
            body["include_stop_str_in_output"] = True
        if conv.partial:
            if not self._settings.continue_final_message:
                raise ChatServiceError(
                    "the prompt continues an open assistant message (the tags protocol writes "
                    "search results inside it), which the chat completions API cannot do; use "
                    'rollout.protocol = "tool_calls", or on vLLM set [model.openai_chat] '
                    "continue_final_message = true"
                )
            conv.messages.append({"role": "assistant", "content": conv.partial})
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        body = self._body(prompt_tokens, num_samples, params)
        data = await self._post(body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ChatServiceError(f"{self.url}: the response has no choices")
        end = self._end_of_message(params)
        out = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0))[:num_samples]:
            text, reason = render_choice(
                choice.get("message") or {},
                choice.get("finish_reason"),
                params,
                end,
                self._settings.include_stop_str_in_output,
            )
            tokens = list(self._tokenizer.encode(text, add_special_tokens=False))
            if len(tokens) > params.max_tokens:
                tokens, reason = tokens[: params.max_tokens], "length"
            out.append(SampledSequence(tuple(tokens), (0.0,) * len(tokens), reason))
        return out

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.setdefault(
            loop, asyncio.Semaphore(self._settings.max_concurrency)
        )
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        s = self._settings
        last = ""
        async with semaphore, httpx.AsyncClient(timeout=s.timeout_seconds) as client:
            for attempt in range(s.max_retries + 1):
                delay = s.retry_backoff_seconds * 2**attempt
                try:
                    response = await client.post(self.url, json=body, headers=headers)
                except (httpx.TimeoutException, httpx.TransportError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code in (401, 403):
                        raise ChatAuthError(
                            f"{self._key_name} was rejected by {self.url} (HTTP "
                            f"{response.status_code}): check the key and that it may use model "
                            f"{self.model!r}"
                        )
                    if response.status_code < 400:
                        try:
                            return response.json()
                        except ValueError as exc:
                            raise ChatServiceError(f"{self.url}: response is not JSON") from exc
                    last = f"HTTP {response.status_code}: {redact_text(response.text[:200])}"
                    if response.status_code not in RETRY_STATUS:
                        raise ChatServiceError(f"{self.url} failed: {last}")
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                    if retry_after is not None:
                        delay = min(retry_after, 60.0)
                if attempt < s.max_retries:
                    await asyncio.sleep(delay)
        raise ChatServiceError(
            f"{self.url} failed after {s.max_retries + 1} tries: {last} (raise "
            f"[model.openai_chat] max_retries / timeout_seconds to wait longer)"
        )

    # ------------------------------------------------------------------ no training

    def _refuse(self, what: str) -> TrainingNotSupported:
        return TrainingNotSupported(
            f"model.provider = 'openai_chat' only samples (for eval); {what} needs a trainable "
            f"provider: 'local', 'taotoken' or 'tinker'"
        )

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        raise self._refuse("forward_backward")

    def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        raise self._refuse("optim_step")

    def save_state(self, path: str) -> None:
        raise self._refuse("save_state")

    def load_state(self, path: str) -> None:
        raise self._refuse("load_state")

    def close(self) -> None:
        pass


def _create(config: Config) -> OpenAIChatProvider:
    return OpenAIChatProvider.from_config(config)


@hookimpl
def register_model_providers(register: Callable[[str, Callable[[Config], Any]], None]) -> None:
    register("openai_chat", _create)
