"""The config schema: one frozen dataclass per ``config.toml`` section, and :class:`Config`.

A setting only one plugin reads lives in that plugin's table (``[model.<provider>]``), as a
settings dataclass of the same shape (``docs/plugins.md``); one several providers read lives in
its section (``[model] api_key``, where the reference setup writes it), and the providers that
read it say so (``reads``; a provider's table cannot set it). Field metadata carries the checks
(:func:`searchr1.core.config_validate.check_table`) and ``secret`` (out of ``repr()``, masked,
redacted from logs). The dataclasses are the schema: a new setting is one field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from searchr1.core.old_imports import warn_plugins
from searchr1.core.secrets import redact_value
from searchr1.defaults import DEFAULT_NAMES
from searchr1.rl.advantages import ESTIMATORS, LOSS_AGG_MODES


def setting(default: Any, **checks: Any) -> Any:
    """A schema field: ``default`` plus checks in its metadata; plugins use it too."""
    # Secrets stay out of repr(), so a config printed in a traceback or log leaks nothing.
    show = not checks.get("secret", False)
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=checks, repr=show)
    return field(default=default, metadata=checks, repr=show)


_f = setting


@dataclass(frozen=True)
class RunConfig:
    name: str = _f("", help="run name; empty = a timestamp")
    dir: str = _f("runs", help="parent folder of run folders")
    #: seeds the question order, every trajectory's sampling and the LoRA initialisation
    seed: int = _f(0, min=0)


@dataclass(frozen=True)
class ModelConfig:
    #: when absent from the file: the provider whose plugin claims the file's [model] table,
    #: else the one its plugin declares the default
    provider: str = _f("", help="model provider plugin name")
    #: the model: builtin:NAME, a local folder, a Hugging Face hub id or a file a model plugin reads
    base_model: str = _f("builtin:tiny")
    #: sampling temperature of rollouts
    temperature: float = _f(0.8, gt=0.0)
    #: nucleus sampling of rollouts; 1.0 = off
    top_p: float = _f(0.95, gt=0.0, max=1.0)
    #: most tokens one assistant turn may sample
    max_new_tokens: int = _f(2048, min=1)
    api_base: str = _f("", help="the model service's URL")
    api_key: str = _f("", secret=True, help='e.g. "${MY_API_KEY}"')
    device: str = _f("auto", help="auto | cpu | cuda | cuda:N | mps")
    #: weights' dtype; auto = bfloat16 on CUDA, else float32
    dtype: str = _f("auto", choices=("auto", "float32", "bfloat16", "float16", "float64"))


@dataclass(frozen=True)
class LoraConfig:
    #: LoRA rank r
    rank: int = _f(32, min=1, max=1024)
    #: LoRA scale numerator (the update is scaled by alpha / rank)
    alpha: float = _f(64.0, gt=0.0)
    #: LoRA dropout while training (the local learner scores with it off)
    dropout: float = _f(0.05, min=0.0, lt=1.0)
    target_modules: tuple[str, ...] = _f(
        ("q_proj", "k_proj", "v_proj", "o_proj"), nonempty=True, split=True
    )  # or "all-linear" (peft: every linear layer but the output head)


@dataclass(frozen=True)
class RolloutConfig:
    #: questions per training step (each one group)
    questions_per_batch: int = _f(8, min=1)
    #: trajectories sampled per question; advantages are relative within the group
    group_size: int = _f(8, min=2)
    #: most searches one trajectory may make
    max_search_calls: int = _f(4, min=0)
    #: most assistant turns one trajectory may take
    max_assistant_turns: int = _f(6, min=1)
    #: prompt + turns + search results of one trajectory, at most
    max_trajectory_tokens: int = _f(8192, min=16)
    protocol: str = _f(DEFAULT_NAMES["rollout.protocol"], help="agent protocol name")
    enable_thinking: bool = _f(False, help="passed to the chat template (tool-calling protocols)")
    #: search results inserted per search, cut to this many tokens
    max_observation_tokens: int = _f(512, min=8)
    #: replace groups whose rewards are all equal (no gradient) by fresh questions
    dynamic_sampling: bool = _f(False)
    #: with dynamic_sampling: extra questions drawn per step at most
    max_extra_draws: int = _f(16, min=0)
    #: with dynamic_sampling: what must differ within a group for it to be kept as
    #: informative: "reward" (the run's reward), or one of its components by name, e.g.
    #: "correct" (the answer's exact match; verl's filter_groups.metric = "acc"), so that a
    #: group whose rewards differ only by a price term is replaced like a degenerate one
    dynamic_sampling_metric: str = _f("reward")
    #: advance a rollout's trajectories a turn at a time together (all sample, then all
    #: search), so the sampler's batches and a seeded run's numbers repeat; false: each
    #: trajectory advances on its own (a slow search holds up only its own trajectory)
    lockstep: bool = _f(True)


@dataclass(frozen=True)
class SearchConfig:
    provider: str = _f("", help="search provider plugin name; when absent: as for [model] provider")
    #: results per search
    top_k: int = _f(3, min=1, max=100)
    #: search requests in flight at most
    max_concurrency: int = _f(16, min=1)
    cache: bool = _f(True, help="answer a repeated query of this run from memory")
    #: keep a keyed (billed) service's answers on disk for later runs (--no-cache: off)
    disk_cache: bool = _f(True)
    #: answers kept on disk older than this are asked again
    cache_ttl_hours: float = _f(168.0, gt=0.0, inf_ok=True)
    cost_per_call: float = _f(0.0, min=0.0, help="price of one paid call; 0 = not reported")
    #: longer queries are cut to this (counted in search/truncated_queries)
    max_query_chars: int = _f(512, min=1)
    #: search success below this holds the step's update back (the environment guard) and fails
    #: smoke
    min_success_rate: float = _f(0.9, min=0.0, max=1.0)
    # the settings of a keyed HTTP search service (searchr1.kit.search.http_provider)
    #: keys of a keyed search service, rotated round-robin; e.g. "${SEARCH_KEYS}"
    api_keys: tuple[str, ...] = _f((), secret=True, split=True)
    api_base: str = _f("", help="empty = the provider's default address")
    #: one search request's timeout
    timeout_seconds: float = _f(10.0, gt=0.0)
    #: retries of a timeout, connection error or 5xx (jittered backoff)
    max_retries: int = _f(2, min=0)
    #: a key limited (429) is benched this long (inf: the run)
    key_cooldown_seconds: float = _f(math.inf, gt=0.0, inf_ok=True)
    #: unusable answers in a row (API error in a 200, malformed body) of one key, while
    #: another key works, that bench it; tried again after key_probe_seconds (doubling)
    key_max_failures: int = _f(3, min=1)
    #: a key benched for key_max_failures is tried again after this (doubling)
    key_probe_seconds: float = _f(60.0, gt=0.0)


@dataclass(frozen=True)
class RewardConfig:
    #: the reward plugin that scores each finished trajectory
    name: str = _f(DEFAULT_NAMES["reward.name"])
    terms: tuple[str, ...] = _f((), unique=True, split=True, help="rewards added to name's")
    weights: dict[str, float] = _f({}, help="weight of name and of each term (1.0 unnamed)")


@dataclass(frozen=True)
class TrainConfig:
    #: RL steps (one optimizer step each)
    max_steps: int = _f(20, min=0)
    #: a checkpoint every N steps (and after the last)
    save_every: int = _f(5, min=1)
    #: 0 = synchronous steps; k = rollouts k steps ahead; when absent from the file: the
    #: model provider's declared default, else 0
    max_staleness: int = _f(0, min=0)
    #: the policy loss plugin
    loss_fn: str = _f(DEFAULT_NAMES["train.loss_fn"])
    #: tokens of one datum (one trajectory) at most
    max_datum_tokens: int = _f(8192, min=16)
    #: datums per micro-batch at most
    max_micro_batch_datums: int = _f(32, min=1)
    #: tokens per micro-batch at most
    max_micro_batch_tokens: int = _f(64000, min=16)
    #: how rewards become advantages (verl's algorithm.adv_estimator): grpo (r - group mean),
    #: rloo (leave-one-out), opo, gpg, reinforce_plus_plus (batch whitening),
    #: reinforce_plus_plus_baseline (group mean, then batch whitening); docs/training.md
    advantage_estimator: str = _f("grpo", choices=tuple(ESTIMATORS))
    #: grpo: divide r - group mean by the group's reward std ("group"), the batch's ("batch")
    #: or nothing ("none"); the unbiased std, as verl and TRL (TRL's scale_rewards)
    scale_rewards: str = _f("none", choices=("none", "group", "batch"))
    #: the same as scale_rewards = "group" (the older spelling)
    scale_advantages_by_std: bool = _f(False)
    #: added to the std scale_rewards divides by (verl 1e-6, TRL 1e-4)
    advantage_eps: float = _f(1e-6, gt=0.0)
    #: how the step's token losses are summed (verl's actor.loss_agg_mode): seq-mean-token-sum
    #: (per trajectory, 1/N), token-mean, seq-mean-token-mean, seq-mean-token-sum-norm
    loss_agg_mode: str = _f("seq-mean-token-sum", choices=LOSS_AGG_MODES)
    #: seq-mean-token-sum-norm's constant L (verl's loss_scale_factor, TRL's
    #: max_completion_length); 0 = rollout.max_trajectory_tokens
    loss_agg_tokens: int = _f(0, min=0)
    #: trajectories cut by a limit (rollout.max_trajectory_tokens, or a last turn cut at
    #: model.max_new_tokens) get no loss; they still count in their group's baseline (TRL's)
    mask_truncated_completions: bool = _f(False)
    #: retries of a step whose search failed (same questions, no update) before the run stops
    #: (exit 3)
    guard_max_waits: int = _f(3, min=0)
    #: first wait of the search guard (doubling each time)
    guard_backoff_seconds: float = _f(30.0, min=0.0)
    #: trajectories written to trajectories/step_N.jsonl per step
    dump_trajectories: int = _f(4, min=0)
    #: greedy held-out EM on [data] eval before the first and after the last step
    eval_before_after: bool = _f(False)
    eval_every: int = _f(0, min=0, help="held-out eval every N steps; 0 = off")
    eval_questions: int = _f(0, min=0, help="questions per eval, some of each source; 0 = all")
    keep_best: bool = _f(False, help="keep the best held-out EM's checkpoint (RUN:best)")


@dataclass(frozen=True)
class ColdStartSettings:
    """``[train.cold_start]``."""

    steps: int = setting(0, min=0, help="supervised steps before RL; 0 = off")
    #: questions per supervised step
    questions_per_step: int = setting(16, min=1)
    #: learning rate of the cold start
    lr: float = setting(1e-4, gt=0.0)
    loss_fn: str = setting(
        DEFAULT_NAMES["train.cold_start.loss_fn"],
        names="loss_fn",
        help="a registered loss; -sum(A * logprob) by default",
    )
    data: str = setting("", help="QA file the teacher plays; empty = data.train")


@dataclass(frozen=True)
class HealthSettings:
    """``[train.health]``; every key optional."""

    #: steps whose mean response length is the baseline of ``health/response_growth``
    baseline_steps: int = field(default=3, metadata={"min": 1})
    #: weight of the newest step in the moving averages (format rate, entropy, searches,
    #: likelihood displacement)
    ema: float = field(default=0.3, metadata={"min": 0.0, "max": 1.0})
    #: alert when the moving average of the format rate, the entropy or the searches per
    #: question falls below this share of its running peak
    cliff_fraction: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    #: alert when the response length exceeds this multiple of the baseline (0 = never)
    max_length_growth: float = field(default=3.0, metadata={"min": 0.0})
    #: n of the repeated n-gram rate
    ngram: int = field(default=4, metadata={"min": 1})
    #: alert when the moving average of displacement/fell_group_frac (share of groups whose
    #: rewarded responses the update made less likely) exceeds this while the moving average
    #: of displacement/delta is below 0 (1 = never)
    displacement_warn_share: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    #: alert when mismatch/k3 (mean KL estimate, sampler vs learner) exceeds this
    mismatch_warn_k3: float = field(default=0.01, metadata={"min": 0.0})
    #: alert when mismatch/ratio_max exceeds this or mismatch/ratio_min is under its inverse
    mismatch_warn_ratio: float = field(default=2.0, metadata={"min": 1.0})
    #: what a health alert does: "warn" logs it; "stop" also saves a checkpoint and ends
    #: the run (exit code 5)
    on_alert: str = field(default="warn", metadata={"choices": ("warn", "stop")})


#: the core's own sub-tables of ``[train]``, checked like a plugin's (``[train.loss]`` is the
#: chosen loss's)
TRAIN_TABLES: dict[str, type] = {"cold_start": ColdStartSettings, "health": HealthSettings}


@dataclass(frozen=True)
class OptimizerConfig:
    #: AdamW learning rate
    lr: float = _f(1e-5, gt=0.0)
    #: AdamW betas
    betas: tuple[float, ...] = _f((0.9, 0.95), length=2, min=0.0, lt=1.0)
    #: AdamW weight decay
    weight_decay: float = _f(0.01, min=0.0)
    #: AdamW epsilon
    eps: float = _f(1e-8, gt=0.0)
    #: the most global gradient norm of a step, of the loss summed over tokens and divided by
    #: the step's trajectories (docs/training.md: the loss's scale); 0 = no clipping
    grad_clip: float = _f(1.0, min=0.0)


@dataclass(frozen=True)
class DataConfig:
    train: str = _f("", help="QA file for training (JSONL or parquet)")
    eval: str = _f("", help="held-out QA file")


@dataclass(frozen=True)
class LogConfig:
    #: metric sinks besides events.jsonl (always on), by registered name
    sinks: tuple[str, ...] = _f((), split=True, unique=True)


@dataclass(frozen=True)
class SmokeConfig:
    """``[smoke]``: the question ``searchr1 smoke`` asks (``--question``/``--answer`` win).
    Empty: the reference setup's Little Prince question, which needs real search."""

    question: str = _f("", help="empty = the reference setup's question (needs real search)")
    answers: tuple[str, ...] = _f((), split=True, help="golden answers of [smoke] question")
    #: behaviour criteria smoke prints but does not require (an untrained model's config)
    report_only: tuple[str, ...] = _f(
        (),
        split=True,
        unique=True,
        choices=("both_signs", "searches_in_range", "answer_format"),
    )


@dataclass(frozen=True)
class Config:
    """The validated config of one run."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    log: LogConfig = field(default_factory=LogConfig)
    smoke: SmokeConfig = field(default_factory=SmokeConfig)
    #: plugin sub-tables, keyed "section.name" (e.g. "search.my_engine")
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    source: str = "<defaults>"
    #: every secret value (for log redaction); never printed
    secrets: frozenset[str] = field(default_factory=frozenset, repr=False)
    #: dotted field -> the ``${VAR}`` it was filled from (so errors can name the variable)
    variables: Mapping[str, str] = field(default_factory=dict)
    #: dotted field -> why it has its value, for fields chosen by inference (config check)
    choices: Mapping[str, str] = field(default_factory=dict)
    #: problems that do not stop a run, printed by config check, smoke and train
    warnings: tuple[str, ...] = ()
    #: the dotted fields the file sets (so a warning can tell "set" from "defaulted")
    explicit: frozenset[str] = field(default_factory=frozenset)
    #: dotted field (and section) -> its line in the file
    lines: Mapping[str, int] = field(default_factory=dict, repr=False)
    #: dotted field -> the command-line flag that set it (``--max-steps``), which messages
    #: name instead of the file's line
    flags: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: name -> :class:`~searchr1.core.types.Asset` (whose module imports this one): the
    #: ``builtin:`` assets of the run's plugins, which :func:`~searchr1.core.config.parse_config`
    #: takes from its registry and this config's ``builtin:`` paths resolve against
    #: (:func:`searchr1.core.assets.resolve`). Not a setting: out of ``==``, ``repr()`` and
    #: :meth:`to_dict`
    assets: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def where(self, dotted: str) -> str:
        """``file:line`` of ``dotted``; of the nearest table holding it when the file leaves
        it out (``[search.local]`` for an unset ``search.local.corpus``); the file alone when
        neither is written; the flag that set it (``--max-steps``) when a flag did."""
        if dotted in self.flags:
            return self.flags[dotted]
        key = dotted
        while key and key not in self.lines:
            key = key.rpartition(".")[0]
        return f"{self.source}:{self.lines[key]}" if key else self.source

    def plugin_table(self, section: str, name: str) -> dict[str, Any]:
        """The raw sub-table ``[section.name]`` (empty when absent)."""
        return dict(self.plugins.get(f"{section}.{name}", {}))

    def replace(self, **sections: Any) -> Config:
        """A copy with fields changed: ``cfg.replace(train={"max_steps": 2})``."""
        changes = {
            name: dataclasses.replace(getattr(self, name), **value)
            if isinstance(value, Mapping) and name in SECTIONS
            else value
            for name, value in sections.items()
        }
        return dataclasses.replace(self, **changes)

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """The resolved config as plain TOML-able data; with ``redact``, secrets replaced by
        ``***`` (a secret-named key's whole value, and :attr:`secrets` wherever they appear)."""
        out: dict[str, Any] = {
            section: {
                k: list(v) if isinstance(v, tuple) else v
                for k, v in vars(getattr(self, section)).items()
            }
            for section in SECTIONS
        }
        for key, table in self.plugins.items():
            section, name = key.split(".", 1)
            out[section][name] = dict(table)
        return redact_value(out, self.secrets, by_name=True) if redact else out


#: section name -> its schema dataclass, in file order
SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Config)
    if dataclasses.is_dataclass(f.default_factory)
}


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
