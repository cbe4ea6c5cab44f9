"""``openai_chat``: a sampling-only model provider over an OpenAI-compatible chat API.

For evaluating hosted models (TaoToken's ``{api_base}/v1/chat/completions``, a vLLM server, any
OpenAI-compatible gateway) with the same rollout, protocol and reward as training. Chosen by
``[model] provider = "openai_chat"``; ``api_base`` and ``api_key`` in ``[model.openai_chat]``
(or in ``[model]``, as for the other providers), ``base_model`` names the model (and its
tokenizer). The factory's :class:`~searchr1.core.types.Model` has a sampler and no trainer, so
``searchr1 train`` refuses the provider before any rollout
(:func:`searchr1.core.trainer_checks.require_trainer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from searchr1.kit.chatml import (
    parse_chatml,
    render_choice,
    thinking_prefill,
)
from searchr1.kit.http import Channel, HttpClient, HttpError, RetryPolicy
from searchr1.kit.protocols.call_formats import (
    CallFormat,
    JsonCallFormat,
    detect_call_format,
)
from searchr1.sdk import (
    ConfigValueError,
    Model,
    ModelFactory,
    Register,
    RemoteMalformed,
    SampledSequence,
    SamplingParams,
    Tokenizer,
    hookimpl,
    plugin_settings,
)

if TYPE_CHECKING:
    from searchr1.sdk import Config


class ChatServiceError(RuntimeError):
    """A prompt the chat completions API cannot take as it is (an open assistant message)."""


@dataclass(frozen=True)
class ChatSettings:
    """``[model.openai_chat]`` (all optional; the server is ``[model] api_base``, e.g.
    TaoToken: https://taotoken.net/api, vLLM: http://host:8000)."""

    #: model name sent to the API; empty = [model] base_model
    model: str = ""
    #: local tokenizer (folder, hub id or builtin:); empty = [model] base_model
    tokenizer: str = ""
    #: one request's timeout
    timeout_seconds: float = field(default=120.0, metadata={"gt": 0.0})
    #: retries of a failed request
    max_retries: int = field(default=3, metadata={"min": 0})
    #: first wait between retries (doubling)
    retry_backoff_seconds: float = field(default=1.0, metadata={"min": 0.0})
    #: a server asking (Retry-After) to wait longer than this fails the call at once
    max_retry_after_seconds: float = field(default=60.0, metadata={"min": 0.0})
    #: requests in flight at most
    max_concurrency: int = field(default=16, metadata={"min": 1})
    #: vLLM extension: continue a partial assistant message (needed by the tags protocol)
    continue_final_message: bool = False
    #: vLLM extension: keep the stop string in the returned text
    include_stop_str_in_output: bool = False


# --------------------------------------------------------------------------- provider


class OpenAIChatProvider:
    """A :class:`~searchr1.core.types.Sampler` over ``POST {api_base}/v1/chat/completions``."""

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
        self.model = model
        self.tokenizer = tokenizer
        self._settings = settings
        self.channel = Channel(
            service="the chat API of provider 'openai_chat'",
            url=self.url,
            address="model.api_base",
            key=key_name,
            model=model,
            timeout_s=settings.timeout_seconds,
            timeout_setting="[model.openai_chat] timeout_seconds",
            retries=f"up to {settings.max_retries} retries ([model.openai_chat] max_retries)",
        )
        self._http = HttpClient(
            policy=RetryPolicy(
                max_retries=settings.max_retries,
                backoff_base_s=settings.retry_backoff_seconds,
                backoff_cap_s=max(settings.retry_backoff_seconds, 30.0),
                max_retry_after_s=settings.max_retry_after_seconds,
                attempt_timeout_s=settings.timeout_seconds,
            ),
            max_connections=settings.max_concurrency,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=settings.timeout_seconds,
            name=f"the HTTP client of provider 'openai_chat' ({self.channel.url})",
        )

    @classmethod
    def from_config(cls, config: Config) -> OpenAIChatProvider:
        from searchr1.kit.tokenizers import provider_tokenizer

        def needs_a_server(settings: ChatSettings) -> list[str]:
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
            key_name=config.variables.get("model.api_key", "model.api_key"),
        )

    def _end_of_message(self, params: SamplingParams) -> str:
        texts = [
            self.tokenizer.decode([t], skip_special_tokens=False) for t in params.stop_token_ids
        ]
        return next((t for t in texts if t == "<|im_end|>"), texts[0] if texts else "")

    @cached_property
    def call_format(self) -> CallFormat:
        """The tool-call format of the local tokenizer's chat template (JSON when it has none
        searchr1 knows: then only the tags protocol can be used, which writes no calls)."""
        from searchr1.kit.protocols.tool_calls import SEARCH_TOOL, ToolCallsProtocol

        def render(messages: list[dict[str, Any]]) -> str:
            return self.tokenizer.apply_chat_template(messages, tools=[SEARCH_TOOL], tokenize=False)

        try:
            return detect_call_format(render, ToolCallsProtocol.call_formats)
        except ConfigValueError:
            return JsonCallFormat()

    def _body(self, prompt_tokens: Sequence[int], n: int, params: SamplingParams) -> dict[str, Any]:
        text = self.tokenizer.decode(list(prompt_tokens), skip_special_tokens=False)
        conv = parse_chatml(text, self.call_format)
        thinking = thinking_prefill(conv.partial)
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
        if thinking is not None:
            # Only the generation prompt's think prefill is open: the server's template writes
            # it again when told the same thinking mode (vLLM's chat_template_kwargs).
            conv.partial = None
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
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
        thinking = body.get("chat_template_kwargs", {}).get("enable_thinking")
        data = await self._post(body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise self.channel.failed(RemoteMalformed, "the response has no choices", "chat")
        end = self._end_of_message(params)
        out = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0))[:num_samples]:
            text, reason = render_choice(
                choice.get("message") or {},
                choice.get("finish_reason"),
                params,
                end,
                self._settings.include_stop_str_in_output,
                self.call_format,
                thinking,
            )
            tokens = list(self.tokenizer.encode(text, add_special_tokens=False))
            if len(tokens) > params.max_tokens:
                tokens, reason = tokens[: params.max_tokens], "length"
            out.append(SampledSequence(tuple(tokens), (0.0,) * len(tokens), reason))
        return out

    async def _post(self, body: dict[str, Any]) -> Any:
        self.channel.announce()
        try:
            response = await self._http.request("POST", self.url, json=body)
        except HttpError as exc:
            raise self.channel.error(exc, "chat") from exc
        try:
            return response.json()
        except ValueError as exc:
            raise self.channel.failed(
                RemoteMalformed, "the response is not JSON", "chat", response.status_code
            ) from exc

    async def aclose(self) -> None:
        """Close the connection pool (the model's ``disconnect``, in the loop that used it)."""
        await self._http.aclose()

    def close(self) -> None:
        """Nothing to release here: connections are closed by :meth:`aclose`, in their loop."""


def _create(config: Config) -> Model:
    provider = OpenAIChatProvider.from_config(config)
    return Model(sampler=provider, disconnect=provider.aclose)


@hookimpl
def register_model_providers(register: Register[ModelFactory]) -> None:
    register(
        "openai_chat",
        _create,
        settings=ChatSettings,
        reads=("api_base", "api_key"),
        secret_variables={"api_key": "OPENAI_API_KEY"},
    )
