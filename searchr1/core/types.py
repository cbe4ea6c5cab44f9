"""The contracts between the core and its plugins: the protocols factories return and the
frozen dataclasses that cross plugin boundaries. No torch import at import time.

Shapes follow the training-service API (``docs/protocols.md`` §5); a tensor name's suffix is
its shape (``logprobs_T``: one value per position)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from searchr1.core.old_imports import warn_plugins

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

    from searchr1.core.config_schema import Config
    from searchr1.core.errors import RemoteError

StopReason = Literal["stop", "length"]
EndReason = Literal[
    "answered",  # the policy produced a final answer action
    "search_limit",  # asked to search past rollout.max_search_calls
    "turn_limit",  # used rollout.max_assistant_turns without answering
    "token_limit",  # the trajectory reached rollout.max_trajectory_tokens
    "invalid_action",  # the turn ended without a parsable search or answer action
]


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SamplingParams:
    """How a provider samples one turn. Every parameter is explicit: no hidden library
    defaults (e.g. ``top_k=50``), which would change the distribution the learner compares
    against. ``temperature == 0`` is greedy, with untempered log-probs. A sample ends once its
    decoded text contains a ``stop_strings`` entry, keeping the completing token only."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    #: the trajectory group the request belongs to (the rollout sets it; a group's datums
    #: carry ``trajectory_id = "<group_id>/<i>"``): a provider with several servers keeps a
    #: group on one. Not a sampling parameter: it never changes the distribution.
    group_id: str = ""


@dataclass(frozen=True)
class SampledSequence:
    """One sample. ``logprobs[i] = log p(tokens[i] | prompt + tokens[:i])`` after
    temperature, before top-p: what the learner computes with the same weights."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: StopReason


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class Datum:
    """One training example (``docs/protocols.md`` §5). All sequences have length N;
    ``input_tokens[i]`` predicts ``target_tokens[i]``. ``sampler_logprobs`` and ``advantages``
    are 0 on prompt and observation positions, so those add nothing to any loss.

    ``sampled`` marks the positions whose target the policy sampled: the tokens a loss reads.
    The policy term trains those with a non-zero advantage; the KL term (``[train.loss]
    kl_coef``) reads them all, so a trajectory of a degenerate group (advantage 0 everywhere)
    still anchors the policy to its reference. Left empty, it is the positions with a
    non-zero advantage."""

    input_tokens: tuple[int, ...]
    target_tokens: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    trajectory_id: str = ""
    #: how many optimizer steps the weights that sampled it had taken (``train.max_staleness``)
    policy_version: int = 0
    sampled: tuple[bool, ...] = ()
    #: what each of its token terms is multiplied by in the loss: the loss's aggregation
    #: (``[train] loss_agg_mode``, :func:`~searchr1.rl.advantages.aggregation_weight`)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.sampled:
            object.__setattr__(self, "sampled", tuple(a != 0.0 for a in self.advantages))
        n = len(self.input_tokens)
        for name in ("target_tokens", "sampler_logprobs", "advantages", "sampled"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Datum {self.trajectory_id or '?'}: {name} has length "
                    f"{len(getattr(self, name))}, input_tokens has {n}"
                )

    def __len__(self) -> int:
        return len(self.input_tokens)


@dataclass(frozen=True)
class AdamParams:
    """One optimizer step's settings, from ``[optimizer]``."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = None


@dataclass(frozen=True)
class ForwardBackwardResult:
    """The micro-batch's summed loss and metrics: sums (``tokens``, ``ratio_sum``, ...) and
    extremes (``*_max``, ``*_min``), never means; the core merges every micro-batch's (and
    under torchrun every rank's) and derives the means once
    (:func:`~searchr1.core.step_metrics.merge_train_metrics`)."""

    loss: float
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossInputs:
    """Per-position inputs of a loss for one datum (or a packed batch), shape ``T``."""

    sampler_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor
    #: the reference policy's log-probs (``[train.loss] kl_coef > 0``); None otherwise
    reference_logprobs_T: torch.Tensor | None = None
    #: each position's datum's :attr:`Datum.weight` (the aggregation); None: 1 everywhere
    weights_T: torch.Tensor | None = None
    #: each position's datum, numbered from 0 in the call (a sequence-level importance ratio
    #: averages over a datum's positions); None: one datum
    sequence_T: torch.Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    """A loss (**sum** over positions) and metrics as sums, so a provider can add them
    across micro-batches and divide by trained tokens once."""

    loss: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class LossFn(Protocol):
    """A policy loss ``(logprobs_new_T, inputs) -> LossOutput``, run by local providers.
    A remote provider sends ``name`` and ``settings`` (the numbers it was built with, and
    each setting that is a word, present only when not its default) to its service instead,
    so a loss the service does not know only works locally
    (:attr:`TrainerCapabilities.losses`)."""

    name: str
    settings: Mapping[str, float | str]

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput: ...


def kl_coef(loss_fn: LossFn) -> float:
    """The loss's KL weight toward the reference policy (``[train.loss] kl_coef``; 0 = none,
    also for a bare loss function without ``settings``, which a learner accepts)."""
    return float(getattr(loss_fn, "settings", {}).get("kl_coef", 0.0))


# --------------------------------------------------------------------------- model


@runtime_checkable
class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the core uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class Sampler(Protocol):
    """Samples tokens; :meth:`sample` is called concurrently from many asyncio tasks. After
    :meth:`Trainer.optim_step` returns, later samples use the updated weights. Scripted
    stand-ins (scripted agents) are Samplers too."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrainerCapabilities:
    """What a :class:`Trainer` can do beyond the contract; the core never probes for methods.

    * ``losses``: trainable :attr:`LossFn.name` s, each with the settings it honours (others
      must be 0); None: any loss. Checked before any rollout
      (:func:`searchr1.core.trainer_checks.check_loss`).
    * ``losses_reason``: why only those; ends that error.
    * ``snapshot_sampler``: pins the sampler to the newest ``optim_step`` weights until the
      next call (awaited in the run's event loop); called at each rollout start when
      ``train.max_staleness > 0``. None: the sampler always follows the newest weights.
    * ``learner_temperature``: the temperature ``forward_backward`` scores at; None if unknown.
    * ``data_parallel``: ``optim_step`` sums the gradients of every torchrun rank first
      (:func:`searchr1.core.distributed.all_reduce_grads`); without it ``train`` refuses to
      run under torchrun with more than one process.
    * ``kl_reference``: makes the current weights the KL term's reference policy (the train
      loop calls it once, after a cold start; never called, the reference is the base model)
      and declares that ``forward_backward`` gives a loss with ``kl_coef > 0`` the
      reference's log-probs (:attr:`LossInputs.reference_logprobs_T`). None: it cannot, and
      ``[train.loss] kl_coef > 0`` is refused before any rollout.
    """

    losses: Mapping[str, frozenset[str]] | None = None
    losses_reason: str = ""
    snapshot_sampler: Callable[[], Awaitable[None]] | None = None
    learner_temperature: float | None = None
    data_parallel: bool = False
    kl_reference: Callable[[], None] | None = None


class Trainer(Protocol):
    """The weights behind a :class:`Sampler` (``docs/protocols.md`` §5); :attr:`capabilities`
    does not change during a run."""

    @property
    def capabilities(self) -> TrainerCapabilities: ...

    async def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> Awaitable[ForwardBackwardResult]:
        """Queue the gradients of ``loss_scale * sum(loss over datums)`` behind every call
        before it; returns once queued, with the awaitable of the result (the training-service
        API's shape: the core queues a step's micro-batches, awaits its :meth:`optim_step`,
        then awaits the results). The result may be computed as late as that ``optim_step``."""

    async def optim_step(self, adam: AdamParams) -> Mapping[str, float]:
        """One optimizer step on the gradients of every ``forward_backward`` queued before
        it; once it returns their results are complete and later samples use the new
        weights. Its numbers are logged as ``optim/<name>``, except ``displacement/*``
        sums (:func:`~searchr1.core.step_metrics.displacement_from_logprobs`), which a
        trainer that can score the step's positive responses after the step reports and
        the core logs as the step's likelihood displacement (the health checks watch it)."""

    def save_state(self, path: str) -> None:
        """Write adapter weights, optimizer state and step under the folder ``path``."""

    async def load_state(self, path: str) -> None:
        """Continue from what :meth:`save_state` wrote under ``path``; once it returns later
        samples and steps use the loaded weights. Awaited in the command's event loop, where
        a trainer can reach its samplers (publish the loaded weights) before returning."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Model:
    """A model factory's result; ``trainer`` None for sample-only providers (``train``
    refuses them). One object may be both."""

    sampler: Sampler
    trainer: Trainer | None = None
    #: awaited once in the command's event loop after the factory returns, before any other
    #: call: what the model needs that loop for to get ready (reaching its servers over HTTP,
    #: publishing its first weights). None: ready as made.
    connect: Callable[[], Awaitable[None]] | None = None
    #: awaited in that loop when the command ends, before ``close``: releases what lives in
    #: the loop (HTTP pools, what ``connect`` set up). None: nothing there.
    disconnect: Callable[[], Awaitable[None]] | None = None

    async def aclose(self) -> None:
        """``disconnect``, then close the trainer and the sampler (an object that is both is
        closed once)."""
        try:
            if self.disconnect is not None:
                await self.disconnect()
        finally:
            if self.trainer is not None:
                self.trainer.close()
            if self.sampler is not self.trainer:
                self.sampler.close()


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class SearchResult:
    """One hit from a search provider."""

    title: str
    text: str
    url: str = ""
    score: float = 0.0


@dataclass(frozen=True)
class SearchResponse:
    """One ``search`` outcome. ``error`` is a short model-readable reason (``"timeout"``);
    None on success, where ``results`` may still be empty. ``failure``: for a remote service
    that failed, the :class:`~searchr1.core.errors.RemoteError` behind ``error`` (its class,
    URL and fix, for a person; never shown to the model)."""

    results: tuple[SearchResult, ...] = ()
    error: str | None = None
    cached: bool = False
    failure: RemoteError | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class SearchProvider(Protocol):
    """An async search engine, called concurrently. ``search`` never raises for a failed
    request: it returns ``error`` set and counts it. Counters are read and reset once per step."""

    async def search(self, query: str, top_k: int) -> SearchResponse: ...

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Counters since the last reset, without the ``search/`` prefix (``calls``,
        ``success_rate``, ``error_rate``, ``latency_p50``, ...)."""

    def available(self) -> bool:
        """False when the provider can no longer serve (e.g. every key is benched)."""

    async def aclose(self) -> None: ...


# --------------------------------------------------------------------------- rollout


@dataclass(frozen=True)
class Question:
    """One QA item: the question, its golden answers and where it comes from."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One assistant turn and the observation the environment answered with."""

    sampled_tokens: tuple[int, ...]
    text: str
    action: Literal["search", "answer", "invalid", "none"]
    query: str | None = None
    observation_tokens: tuple[int, ...] = ()
    observation_text: str = ""
    search_error: str | None = None
    #: why sampling of this turn stopped ("stop" | "length")
    stop_reason: str = ""


@dataclass(frozen=True)
class Trajectory:
    """A finished rollout of one question. ``tokens`` = prompt + sampled + observation
    tokens; where ``generated_mask[i]``, ``logprobs[i]`` is the sampler log-prob (else 0.0)."""

    trajectory_id: str
    question: str
    golden_answers: tuple[str, ...]
    tokens: tuple[int, ...]
    generated_mask: tuple[bool, ...]
    logprobs: tuple[float, ...]
    prompt_len: int
    turns: tuple[Turn, ...]
    end_reason: EndReason
    #: the final answer the agent protocol parsed from the answering turn (None: no answer)
    final_answer: str | None
    #: everything after the prompt (turns and observations) decoded with special tokens kept
    final_text: str
    search_calls: int
    search_errors: int
    data_source: str = ""
    group_id: str = ""
    #: the agent protocol's verdict, recorded by the rollout: it answered in the protocol's
    #: format (:meth:`~searchr1.core.agent_protocol.AgentProtocol.answered_in_format`); the
    #: rewards, health, eval and smoke read it
    format_ok: bool = False
    #: optimizer steps taken by the weights it was sampled with (set by the train loop)
    policy_version: int = 0

    def to_dict(self, result: RewardResult | None = None) -> dict[str, Any]:
        """A readable JSON-able record (no token ids), as in ``trajectories/step_XXXXXX.jsonl``."""
        out: dict[str, Any] = {
            "trajectory_id": self.trajectory_id,
            "group_id": self.group_id,
            "data_source": self.data_source,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "turns": [
                {
                    "text": t.text,
                    "action": t.action,
                    "query": t.query,
                    "observation_text": t.observation_text,
                    "search_error": t.search_error,
                }
                for t in self.turns
            ],
            "final_answer": self.final_answer,
            "format_ok": self.format_ok,
            "end_reason": self.end_reason,
            "search_calls": self.search_calls,
            "search_errors": self.search_errors,
            "num_tokens": len(self.tokens),
            "num_generated_tokens": sum(self.generated_mask),
        }
        if result is not None:
            out["reward"] = result.reward
            out["components"] = dict(result.components)
        return out


@dataclass(frozen=True)
class RewardResult:
    """A reward and its named components (``format``, ``correct``, ``f1``, ...)."""

    reward: float
    components: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class RewardFn(Protocol):
    """Scores a finished trajectory, once per trajectory after the rollout."""

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult: ...


@runtime_checkable
class MetricSink(Protocol):
    """Where a run's numbers go besides ``events.jsonl``. Receives only redacted data;
    a method that raises is reported once as ``sink_failed`` and training goes on."""

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Once, at start: the redacted config as ``{section: {key: value}}``."""

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Every step's ``metrics`` and held-out evaluations (``eval/heldout_em``)."""

    def log_texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        """A few readable texts, e.g. ``name="trajectories"``, one string each."""

    def close(self) -> None:
        """Flush and release (end of the run)."""


@dataclass(frozen=True)
class ScoredGroup:
    """One question's trajectories, rewards and advantages; ``degenerate`` when all
    rewards are equal (nothing to learn)."""

    question: Question
    trajectories: list[Trajectory]
    rewards: list[RewardResult]
    advantages: tuple[float, ...]
    degenerate: bool


# --------------------------------------------------------------------------- factories

# A factory gets the validated Config (its table: ``config.plugin_table(kind, name)``).
ModelFactory = Callable[["Config"], Model]
SearchFactory = Callable[["Config"], SearchProvider]
RewardFactory = Callable[["Config"], RewardFn]
LossFactory = Callable[["Config"], LossFn]
MetricSinkFactory = Callable[["Config", Path], MetricSink]


@dataclass(frozen=True)
class Asset:
    """A ``builtin:NAME`` asset. ``build(folder)`` fills an empty folder, once per
    ``version`` (bump it when the files change). Optional ``ceiling(config, tokenizer,
    protocol)`` returns a scripted :class:`Sampler` that answers its questions perfectly (or
    None): the cold start imitates it, and ``train`` evaluates it on the asset's held-out set.
    ``takes``: about how long a build takes and what it writes (``"about 30 s on 2 CPU cores;
    540 MB"``), said when a build starts."""

    version: str
    build: Callable[[Path], None]
    ceiling: Callable[[Config, Any, Any], Sampler | None] | None = None
    takes: str = ""


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
