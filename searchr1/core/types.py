"""The contracts between the core and its plugins.

Every plugin factory registered through :mod:`searchr1.core.hookspecs` returns one of the
protocols below; every value that crosses a plugin boundary is one of the frozen dataclasses
here. Nothing in this module imports torch at import time, so the CLI starts fast and a
search or reward plugin can be written without it.

Shapes follow the training-service API of ``docs/protocols.md`` §5 (a model provider's :class:`Sampler` samples tokens, its
:class:`Trainer` trains on ``Datum`` s).
Tensor names carry their shape as a suffix: ``logprobs_T`` is one value per position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

    from searchr1.core.config_schema import Config

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
    """How a model provider samples one turn.

    Every parameter is explicit: providers must not apply hidden library defaults
    (``transformers`` applies ``top_k=50`` unless told otherwise, which silently changes the
    distribution the learner's log-probs are compared against).

    ``temperature == 0`` means greedy decoding; the returned log-probs are then those of the
    untempered distribution. ``stop_strings`` end a sample as soon as the decoded text of the
    generated tokens contains one of them; the sample keeps the token that completed the
    string and nothing after it.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class SampledSequence:
    """One sample: the generated token ids, the sampler's log-prob of each, and why it ended.

    ``logprobs[i]`` is ``log p(tokens[i] | prompt + tokens[:i])`` under the sampling
    distribution (after temperature, before top-p truncation), i.e. what the learner computes
    for the same token with the same weights and temperature.
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: StopReason


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class Datum:
    """One training example in the training-service layout (``docs/protocols.md`` §5).

    All four sequences have length N. ``input_tokens[i]`` predicts ``target_tokens[i]`` (the
    full sequence shifted by one). ``sampler_logprobs`` and ``advantages`` are 0 on prompt and
    observation positions, so those positions add nothing to any policy loss.
    ``trajectory_id`` names the trajectory in error messages.
    """

    input_tokens: tuple[int, ...]
    target_tokens: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    trajectory_id: str = ""
    #: how many optimizer steps the weights that sampled it had taken (``train.max_staleness``)
    policy_version: int = 0

    def __post_init__(self) -> None:
        n = len(self.input_tokens)
        for name in ("target_tokens", "sampler_logprobs", "advantages"):
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
    """What ``forward_backward`` returns: the summed loss of the micro-batch and metrics
    (``tokens``, ``ratio_mean``, ``clip_fraction``, ...)."""

    loss: float
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossInputs:
    """Per-position inputs of a loss for one datum (or a packed batch), shape ``T``."""

    sampler_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor


@dataclass(frozen=True)
class LossOutput:
    """A loss value (a **sum** over positions) and metrics as sums over positions.

    Metrics are sums so that a provider can add them across micro-batches and divide by the
    number of trained tokens once (e.g. ``ratio_sum`` / ``tokens``).
    """

    loss: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class LossFn(Protocol):
    """A policy loss: ``(logprobs_new_T, inputs) -> LossOutput``, with its name and settings.

    Called by a local model provider inside ``forward_backward``. A remote provider cannot
    run the function: it sends ``name`` and the ``settings`` its service understands (e.g.
    ``clip_low``/``clip_high`` of ``ppo``) and computes the loss there, so a loss that a
    service does not know by name only works locally. ``settings`` are the numbers the
    function was built with (``[train.loss]`` for the built-in losses; empty when it takes
    none), so a provider reads them here instead of looking inside the callable. A trainer
    that only knows some losses declares which (:attr:`TrainerCapabilities.losses`).
    """

    name: str
    settings: Mapping[str, float]

    def __call__(self, logprobs_T: torch.Tensor, inputs: LossInputs) -> LossOutput: ...


# --------------------------------------------------------------------------- model


@runtime_checkable
class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the core uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class Sampler(Protocol):
    """A policy that samples tokens: the half of a model provider every command uses.

    The rollout calls :meth:`sample` concurrently from many asyncio tasks. Its weights are
    those of the :class:`Trainer` it comes with, when it has one: after
    :meth:`Trainer.optim_step` returns, every later ``sample`` uses the updated weights. A
    scripted stand-in (a data asset's ceiling agent, the cold start's teacher) is a Sampler
    too.
    """

    @property
    def tokenizer(self) -> Tokenizer: ...

    async def sample(
        self, prompt_tokens: Sequence[int], num_samples: int, params: SamplingParams
    ) -> list[SampledSequence]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrainerCapabilities:
    """What a :class:`Trainer` can do beyond the contract, declared up front.

    The core reads these fields and never inspects a trainer for methods or attributes:

    * ``losses``: the losses it trains, by :attr:`LossFn.name`, each with the
      :attr:`LossFn.settings` it honours; a setting outside that set must be 0 (off). None:
      any loss (the trainer calls the function itself). Checked once the model is created,
      before any rollout (:func:`searchr1.core.trainer_checks.check_loss`), as a ConfigError
      naming the config field that chose the loss (``train.loss_fn``, ``cold_start.loss_fn``).
    * ``losses_reason``: why only those, ending that error (e.g. "it sends the loss's name
      to a service that computes the loss itself").
    * ``snapshot_sampler``: pins the sampler to the newest weights an ``optim_step`` has
      produced, until the next call, whatever the trainer does meanwhile. Pipelined steps
      (``train.max_staleness > 0``) call it at the start of every rollout
      (:mod:`searchr1.core.pipeline`). None: the sampler always follows the newest weights.
    * ``learner_temperature``: the temperature at which :meth:`Trainer.forward_backward`
      scores tokens, None when unknown (a remote service); logged at the start of training
      with what the importance ratio compares.
    """

    losses: Mapping[str, frozenset[str]] | None = None
    losses_reason: str = ""
    snapshot_sampler: Callable[[], None] | None = None
    learner_temperature: float | None = None


class Trainer(Protocol):
    """The weights behind a :class:`Sampler`, trained in the training-service shape (``docs/protocols.md`` §5).

    The train loop calls :meth:`forward_backward` once per micro-batch, then
    :meth:`optim_step` once per step; checkpoints call :meth:`save_state`, ``--resume`` and
    ``searchr1 eval --checkpoint`` call :meth:`load_state`. :attr:`capabilities` says what
    else it can do; it may be read at any time and does not change during a run.
    """

    @property
    def capabilities(self) -> TrainerCapabilities: ...

    def forward_backward(
        self, datums: Sequence[Datum], loss_fn: LossFn, loss_scale: float = 1.0
    ) -> ForwardBackwardResult:
        """Accumulate gradients of ``loss_scale * sum(loss over datums)``."""
        ...

    def optim_step(self, adam: AdamParams) -> Mapping[str, float]: ...

    def save_state(self, path: str) -> None:
        """Write adapter weights, optimizer state and step under the folder ``path``."""
        ...

    def load_state(self, path: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Model:
    """What a model provider's factory returns: a sampler, and the trainer of its weights.

    ``trainer`` is None for a provider that only samples (a hosted chat API): ``smoke`` and
    ``eval`` run with it, ``train`` refuses it before any rollout. One object may be both
    (a provider that samples and trains the same weights in one process).
    """

    sampler: Sampler
    trainer: Trainer | None = None

    def close(self) -> None:
        """Close the trainer, then the sampler (an object that is both is closed once)."""
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
    """The outcome of one ``search`` call. ``error`` is a short, model-readable reason
    (``"timeout"``, ``"quota exhausted (429)"``, ``"empty query"``); it is ``None`` on
    success, and ``results`` may then still be empty."""

    results: tuple[SearchResult, ...] = ()
    error: str | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class SearchProvider(Protocol):
    """An asynchronous search engine, created once per run by the factory registered under
    ``[search] provider``. ``search`` never raises for a failed request: it returns a
    ``SearchResponse`` with ``error`` set and counts it. The rollout calls ``search`` from many
    trajectories concurrently; the train loop reads and resets the counters once per step."""

    async def search(self, query: str, top_k: int) -> SearchResponse: ...

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Counters since the last reset, named without the ``search/`` prefix:
        ``calls``, ``success_rate``, ``error_rate``, ``429_rate``, ``timeout_rate``,
        ``latency_p50``, ``latency_p95``, ``cache_hit_rate``, ``keys_available``, ..."""
        ...

    def available(self) -> bool:
        """False when the provider can no longer serve (e.g. every key is benched)."""
        ...

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
    sampled_logprobs: tuple[float, ...]
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
    """A finished rollout of one question, token-in/token-out.

    ``tokens`` is the whole sequence (prompt, sampled and observation tokens);
    ``generated_mask[i]`` is True where the policy sampled ``tokens[i]`` and
    ``logprobs[i]`` is then its sampler log-prob (0.0 elsewhere). ``prompt_len`` tokens open
    the sequence.
    """

    trajectory_id: str
    question: str
    golden_answers: tuple[str, ...]
    tokens: tuple[int, ...]
    generated_mask: tuple[bool, ...]
    logprobs: tuple[float, ...]
    prompt_len: int
    turns: tuple[Turn, ...]
    end_reason: EndReason
    final_answer: str | None
    #: everything after the prompt (turns and observations) decoded with special tokens kept
    final_text: str
    search_calls: int
    search_errors: int
    data_source: str = ""
    group_id: str = ""
    #: the agent protocol that produced it (``tags`` | ``tool_calls``): rewards read the
    #: answer format from it (``searchr1.core.agent_protocol.extract_answers``)
    protocol: str = ""
    #: optimizer steps taken by the weights it was sampled with (set by the train loop)
    policy_version: int = 0


@dataclass(frozen=True)
class RewardResult:
    """A reward and its named components (``format``, ``correct``, ``f1``, ...)."""

    reward: float
    components: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class RewardFn(Protocol):
    """Scores a finished trajectory: ``(trajectory, golden_answers) -> RewardResult``.

    Called by the train loop, smoke and eval once per trajectory, after the rollout."""

    def __call__(self, trajectory: Trajectory, golden_answers: Sequence[str]) -> RewardResult: ...


@runtime_checkable
class MetricSink(Protocol):
    """Where a run's numbers go besides ``events.jsonl`` (an experiment tracker, ...).

    Created once per ``searchr1 train`` run from ``[log] sinks``; fed by the logging layer
    (:mod:`searchr1.core.sinks`), never by plugin call order. Everything it receives has
    already been redacted: configured secrets never reach a sink. A method that raises is
    reported once as a ``sink_failed`` warning and training goes on.
    """

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Once, at start: the resolved, redacted config as nested ``{section: {key: value}}``."""
        ...

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Every step's ``metrics`` event (``reward/mean``, ``search_rate``, ...) and held-out
        evaluations (``eval/heldout_em`` at step 0 and at the last step)."""
        ...

    def log_texts(self, step: int, name: str, texts: Sequence[str]) -> None:
        """A few readable texts, e.g. ``name="trajectories"``: the step's dumped
        trajectories rendered as plain text (one string each)."""
        ...

    def close(self) -> None:
        """Flush and release files or connections (end of the run)."""
        ...


@dataclass(frozen=True)
class ScoredGroup:
    """One question's group of a training step: its trajectories, their rewards and
    advantages; ``degenerate`` when every reward is the same (nothing to learn)."""

    question: Question
    trajectories: list[Trajectory]
    rewards: list[RewardResult]
    advantages: tuple[float, ...]
    degenerate: bool


@dataclass(frozen=True)
class Alert:
    """One warning of a step monitor, logged as a ``health_alert`` event: a short ``kind``
    (``format_cliff``, ``mismatch``, ...) and a sentence for the console and the report."""

    kind: str
    message: str


@runtime_checkable
class StepMonitor(Protocol):
    """Watches a training run, one step at a time: advice, never part of the update.

    Created once per ``searchr1 train`` run from ``[train] monitors``. After each step's
    update the loop calls :meth:`observe`; the metrics it returns join the step's ``metrics``
    event, each alert is logged as a ``health_alert`` warning. :meth:`state` is saved in
    every checkpoint under the monitor's registered name and handed back to
    :meth:`load_state` on ``--resume``; :meth:`totals` joins the ``train_done`` event.
    """

    def observe(
        self,
        step: int,
        groups: Sequence[ScoredGroup],
        trajectories: Sequence[Trajectory],
        rewards: Sequence[RewardResult],
        train_metrics: Mapping[str, float],
        staleness: float,
    ) -> tuple[dict[str, float], list[Alert]]:
        """One step: ``groups`` are those it trained on, ``trajectories`` and ``rewards`` its
        first draw (the unbiased sample of the policy), ``train_metrics`` the learner's merged
        metrics (``mismatch/*``, ``tokens``, ...), ``staleness`` the step's ``staleness/max``
        (updates between the sampling weights and the trained ones)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to carry on (JSON-serializable)."""
        ...

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; ``{}`` when the checkpoint holds none for this monitor."""
        ...

    def totals(self) -> dict[str, Any]:
        """Run-long numbers for the ``train_done`` event (``{}`` for none)."""
        ...


# --------------------------------------------------------------------------- factories

# A factory receives the run's validated Config (its own table under e.g. ``[search.my_search]``
# is ``config.plugin_table("search", "my_search")``) and returns the plugin instance.
ModelFactory = Callable[["Config"], Model]
SearchFactory = Callable[["Config"], SearchProvider]
RewardFactory = Callable[["Config"], RewardFn]
LossFactory = Callable[["Config"], LossFn]
# A metric sink's factory also gets the run folder (the run's name is ``run_dir.name``).
MetricSinkFactory = Callable[["Config", Path], MetricSink]
StepMonitorFactory = Callable[["Config"], StepMonitor]


@dataclass(frozen=True)
class Asset:
    """A ``builtin:NAME`` asset, registered by a plugin's ``register_assets`` hook.

    ``build(folder)`` writes the asset's files into an empty ``folder`` (called at most once
    per ``version`` and cache folder by :func:`searchr1.core.builtins.resolve`; bump the
    version whenever the files it writes change, so stale caches are rebuilt). ``ceiling``,
    optional, is for a data asset whose questions a scripted agent can answer perfectly:
    ``ceiling(config, tokenizer, protocol)`` returns a :class:`Sampler` stand-in (or
    None when it cannot play this config), which ``searchr1 train`` evaluates once at step 0
    on the held-out set as the reachable ceiling (its "ceiling" evaluation), and which the
    ``[cold_start]`` stage imitates when the training file is the asset's
    (:mod:`searchr1.core.cold_start`).
    """

    version: str
    build: Callable[[Path], None]
    ceiling: Callable[[Config, Any, Any], Sampler | None] | None = None


@dataclass(frozen=True)
class FileFormat:
    """A model file format a plugin converts, registered by ``register_file_formats`` under
    its suffix (e.g. ``".ckptzip"``).

    A config path that ends in the suffix (``[model] base_model = "/models/x.ckptzip"``) is
    converted once by ``convert(file, folder)`` into an empty cache folder that
    ``from_pretrained`` loads, and resolves to that folder
    (:func:`searchr1.core.builtins.resolve`). The cache key covers the file's absolute path,
    size and modification time, and ``version``: bump it when the conversion changes.
    """

    version: str
    convert: Callable[[Path, Path], None]
