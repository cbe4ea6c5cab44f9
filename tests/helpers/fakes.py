"""Fakes for rollout, reward and smoke tests: a scripted model provider and an in-memory
search provider.

``ScriptedModel`` is a real :class:`~searchr1.core.types.Sampler` and
:class:`~searchr1.core.types.Trainer` (training does nothing) whose "policy" is a script: trajectory ``i`` of every group emits ``scripts[i][k]`` at its ``k``-th turn (text is
encoded with the tokenizer; a list of ints is emitted as is). Like simonw/llm's mock model it
records every call, so tests can assert what the rollout sent. Log-probs are ``-(k + 1)`` for
every token of turn ``k``, so a test can tell turns apart in ``Trajectory.logprobs``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainer_calls import answered

from searchr1.core.hookspecs import Register, hookimpl
from searchr1.core.types import (
    ForwardBackwardResult,
    Model,
    ModelFactory,
    SampledSequence,
    SamplingParams,
    SearchResponse,
    SearchResult,
    TrainerCapabilities,
    kl_coef,
)


@lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    """The tiny model's tokenizer (byte-level BPE, agent tags as single tokens, Qwen-style
    chat template with tools), built in about a second and shared by the tests."""
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    return build_tokenizer(BUILTIN_TEXT, 1024)


def build_small_tiny_model(
    folder: Any, *, vocab_size: int = 700, max_position_embeddings: int = 128
) -> Any:
    """The offline world's tiny architecture at test size (2 layers, hidden 64, GQA 4/2),
    random-init, saved under ``folder``: load it by path like a real model."""
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tiny_model

    return build_tiny_model(
        folder,
        BUILTIN_TEXT,
        vocab_size=vocab_size,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=max_position_embeddings,
    )


@lru_cache(maxsize=4)
def template_tokenizer(name: str) -> Any:
    """The tiny tokenizer with a test chat template from ``tests/chat_templates/<name>.jinja``
    (``qwen3``: Qwen3's JSON tool calls; ``qwen3_5``: Qwen3.5's XML calls and think prefill)."""
    from pathlib import Path

    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tok = build_tokenizer(BUILTIN_TEXT, 1024)
    path = Path(__file__).parents[1] / "chat_templates" / f"{name}.jinja"
    tok.chat_template = path.read_text(encoding="utf-8")
    return tok


ScriptTurn = str | Sequence[int]


@dataclass
class Call:
    prompt: tuple[int, ...]
    num_samples: int
    params: SamplingParams


class ScriptedModel:
    """A model provider that plays fixed turns.

    The first call for a prompt (``num_samples = n``) returns the first turn of scripts
    ``0..n-1``; every later call (``num_samples = 1``) is matched to its script by the
    first turn that follows the initial prompt, so scripts of one group must start with
    different turns. A turn longer than ``params.max_tokens`` is cut and reported as
    ``"length"``, as a real sampler would. ``fail`` makes every call raise (a broken channel).
    ``capabilities`` is what it declares as a trainer (default: any loss, no snapshot
    sampler, learner temperature unknown).
    """

    def __init__(
        self,
        tokenizer: Any,
        scripts: Sequence[Sequence[ScriptTurn]],
        *,
        fail: Exception | None = None,
        on_call: Callable[[Call], None] | None = None,
        capabilities: TrainerCapabilities | None = None,
    ):
        self._tokenizer = tokenizer
        self.capabilities = capabilities or TrainerCapabilities()
        self.on_call = on_call
        self.scripts = [[self._tokens(t) for t in s] for s in scripts]
        self.fail = fail
        self.calls: list[Call] = []
        #: every datum :meth:`forward_backward` was given
        self.trained: list[Any] = []
        self.snapshots = 0
        self._groups: list[tuple[tuple[int, ...], list[int]]] = []  # (prompt, turns emitted)

    def _tokens(self, turn: ScriptTurn) -> tuple[int, ...]:
        if isinstance(turn, str):
            return tuple(self._tokenizer.encode(turn, add_special_tokens=False))
        return tuple(turn)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _emit(self, script: int, turn: int, params: SamplingParams) -> SampledSequence:
        turns = self.scripts[script]
        if turn >= len(turns):
            raise AssertionError(f"script {script} has no turn {turn} (it has {len(turns)})")
        tokens = turns[turn]
        stop = "stop"
        if len(tokens) > params.max_tokens:
            tokens, stop = tokens[: params.max_tokens], "length"
        return SampledSequence(tuple(tokens), tuple([-(turn + 1.0)] * len(tokens)), stop)  # type: ignore[arg-type]

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]:
        prompt = tuple(prompt_tokens)
        self.calls.append(Call(prompt, num_samples, params))
        if self.on_call is not None:
            self.on_call(self.calls[-1])
        await asyncio.sleep(0)  # yield like a real provider, so other tasks interleave
        if self.fail is not None:
            raise self.fail
        # The newest group with this prompt: a question rolled out again (a second eval) starts over.
        for start, emitted in reversed(self._groups):
            if prompt[: len(start)] != start or len(prompt) == len(start):
                continue
            rest = prompt[len(start) :]
            for i, turns in enumerate(self.scripts):
                if rest[: len(turns[0])] == turns[0] and i < len(emitted):
                    emitted[i] += 1
                    return [self._emit(i, emitted[i] - 1, params)]
        if num_samples > len(self.scripts):
            raise AssertionError(f"asked for {num_samples} samples, {len(self.scripts)} scripts")
        self._groups.append((prompt, [1] * num_samples))
        return [self._emit(i, 0, params) for i in range(num_samples)]

    async def forward_backward(self, datums: Any, loss_fn: Any, loss_scale: float = 1.0) -> Any:
        """No weights: records ``datums`` and reports the token counts a real learner would
        (``tokens`` with a non-zero advantage, at ratio 1; ``kl_tokens``, every sampled token,
        when the loss has a KL term), as an answer already there."""
        self.trained.extend(datums)
        tokens = float(sum(a != 0.0 for d in datums for a in d.advantages))
        metrics = {"tokens": tokens, "ratio_sum": tokens}  # on-policy: every ratio is 1
        if kl_coef(loss_fn) > 0:
            kl_tokens = float(sum(sum(d.sampled) for d in datums))
            metrics |= {"kl_sum": 0.0, "kl_tokens": kl_tokens, "kl_max": 0.0}
        return answered(ForwardBackwardResult(loss=0.0, metrics=metrics))

    async def optim_step(self, adam: Any) -> Mapping[str, float]:
        return {}

    async def snapshot_sampler(self) -> None:
        """Counts the calls; the train loop makes them only when ``capabilities`` declares
        this method (a trainer is never probed for it)."""
        self.snapshots += 1

    def save_state(self, path: str) -> None:
        """No weights: a marker file, so its checkpoints resume like a real trainer's."""
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "scripted.json").write_text("{}")

    async def load_state(self, path: str) -> None:
        (Path(path) / "scripted.json").read_text()  # a missing state fails as a real one does

    def close(self) -> None:
        pass


@dataclass
class FakeSearch:
    """An in-memory search provider. ``responses`` maps a query to its response (default:
    one hit titled after the query); ``gates`` maps a query to an event the search waits on
    (to hold one trajectory's search while others run). Counts like a real provider."""

    responses: dict[str, SearchResponse] = field(default_factory=dict)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    raise_for: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)
    calls: int = 0
    errors: int = 0

    async def search(self, query: str, top_k: int) -> SearchResponse:
        self.queries.append(query)
        self.calls += 1
        if query in self.gates:
            await self.gates[query].wait()
        if query in self.raise_for:
            raise ConnectionError("boom")
        response = self.responses.get(
            query, SearchResponse((SearchResult(title=f"About {query}", text=f"{query} facts"),))
        )
        self.errors += response.error is not None
        return response

    def metrics(self, reset: bool = False) -> dict[str, float]:
        calls = max(self.calls, 1)
        out = {
            "calls": float(self.calls),
            "success_rate": (self.calls - self.errors) / calls,
            "error_rate": self.errors / calls,
        }
        if reset:
            self.calls = self.errors = 0
        return out

    def available(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


class ScriptedPlugin:
    """A plugin registering the ``scripted`` model provider (see ``tests/conftest.py``).

    Config: ``[model] provider = "scripted"`` and ``[model.scripted] turns = [[...], ...]``
    (one list of turn texts per trajectory) and optionally ``fail = "message"``,
    ``chat_template = "qwen3_5"`` (the tokenizer gets that test template),
    ``trains = false`` (the factory's Model has no trainer: a provider that only samples),
    and what the trainer declares: ``losses = ["ppo", ...]`` (only those, no settings),
    ``snapshot = true`` (its :meth:`ScriptedModel.snapshot_sampler`),
    ``learner_temperature = 0.8`` and ``kl_reference = true`` (it takes a KL term; pinning
    does nothing).
    """

    __name__ = "scripted_test_plugin"

    def __init__(self) -> None:
        self.created: list[ScriptedModel] = []

    @hookimpl
    def register_model_providers(self, register: Register[ModelFactory]) -> None:
        register("scripted", self.create)

    def create(self, config: Any) -> Model:
        table = config.plugin_table("model", "scripted")
        fail = table.get("fail")
        template = table.get("chat_template")  # a tests/chat_templates name, e.g. "qwen3_5"
        model = ScriptedModel(
            template_tokenizer(template) if template else tiny_tokenizer(),
            table.get("turns", [["<answer> nothing </answer>"]]),
            fail=RuntimeError(fail) if fail else None,
        )
        losses = table.get("losses")
        model.capabilities = TrainerCapabilities(
            losses=None if losses is None else {name: frozenset() for name in losses},
            losses_reason="a scripted test trainer" if losses is not None else "",
            snapshot_sampler=model.snapshot_sampler if table.get("snapshot") else None,
            learner_temperature=table.get("learner_temperature"),
            kl_reference=(lambda: None) if table.get("kl_reference") else None,
        )
        self.created.append(model)
        return Model(sampler=model, trainer=model if table.get("trains", True) else None)
