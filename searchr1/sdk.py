"""The plugin SDK: every name a searchr1 plugin imports from searchr1 (docs/plugins.md).

A plugin imports from ``searchr1`` only this module, :mod:`searchr1.kit` (helpers: HTTP
clients, search bases, the judge, tokenizers) and its own package; the names below are the
promised ones and keep their meaning across releases. The hooks (one per plugin kind) are
:data:`hookimpl`-marked functions receiving a :data:`Register`; the contracts and the data
they exchange, the errors, the settings helpers, logging and atomic writes follow.
"""

from __future__ import annotations

from searchr1.core.agent_protocol import INVALID, Action, ActionKind, AgentProtocol
from searchr1.core.answers import (
    ANSWER_LINE_RE,
    answer_elements,
    answer_lines,
    exact_match,
    f1_score,
    normalize_answer,
)
from searchr1.core.assets import COMPLETE, cache_dir, ensure_built
from searchr1.core.assets import resolve as resolve_asset
from searchr1.core.config_schema import Config, ModelConfig, SearchConfig, setting
from searchr1.core.config_validate import check_table, plugin_settings
from searchr1.core.disk import (
    atomic_write,
    hold_folder,
    make_temp_dir,
    make_temp_file,
    match_umask,
    write_text_atomic,
)
from searchr1.core.distributed import RankLost, World, all_reduce_grads, collective
from searchr1.core.errors import (
    EXIT_DISK,
    EXIT_ENVIRONMENT_DOWN,
    EXIT_HEALTH_STOP,
    REMOTE_FAILURES,
    ConfigError,
    ConfigValueError,
    DiskError,
    EnvironmentDown,
    Interrupted,
    PluginError,
    RemoteAuthError,
    RemoteConnectionLost,
    RemoteError,
    RemoteHostUnknown,
    RemoteMalformed,
    RemoteRateLimited,
    RemoteRefused,
    RemoteRejected,
    RemoteServerError,
    RemoteStepError,
    RemoteTimeout,
    RemoteTLSError,
    RemoteUnknownModel,
    SearchR1Error,
    UserError,
)
from searchr1.core.hookspecs import Register, hookimpl
from searchr1.core.logs import get_logger, warn
from searchr1.core.old_imports import moved_module, offer
from searchr1.core.plugins import Registration
from searchr1.core.scripted import UNKNOWN, ScriptedSampler, ScriptedTeacher
from searchr1.core.secrets import is_secret_name, redact_text, register_secrets
from searchr1.core.step_metrics import (
    displacement_from_logprobs,
    merge_train_metrics,
    mismatch_from_logprobs,
)
from searchr1.core.stop import Stop
from searchr1.core.trainer_checks import check_loss
from searchr1.core.types import (
    AdamParams,
    Asset,
    Datum,
    EndReason,
    ForwardBackwardResult,
    LossFactory,
    LossFn,
    LossInputs,
    LossOutput,
    MetricSink,
    MetricSinkFactory,
    Model,
    ModelFactory,
    Question,
    RewardFactory,
    RewardFn,
    RewardResult,
    SampledSequence,
    Sampler,
    SamplingParams,
    ScoredGroup,
    SearchFactory,
    SearchProvider,
    SearchResponse,
    SearchResult,
    StopReason,
    Tokenizer,
    Trainer,
    TrainerCapabilities,
    Trajectory,
    Turn,
    kl_coef,
)

__all__ = [
    # hooks
    "Register",
    "Registration",
    "hookimpl",
    # contracts and the data they exchange
    "AdamParams",
    "Asset",
    "Datum",
    "EndReason",
    "ForwardBackwardResult",
    "LossFactory",
    "LossFn",
    "LossInputs",
    "LossOutput",
    "MetricSink",
    "MetricSinkFactory",
    "Model",
    "ModelFactory",
    "Question",
    "RewardFactory",
    "RewardFn",
    "RewardResult",
    "SampledSequence",
    "Sampler",
    "SamplingParams",
    "ScoredGroup",
    "SearchFactory",
    "SearchProvider",
    "SearchResponse",
    "SearchResult",
    "StopReason",
    "Tokenizer",
    "Trainer",
    "TrainerCapabilities",
    "Trajectory",
    "Turn",
    "kl_coef",
    # agent protocols and answers
    "ANSWER_LINE_RE",
    "INVALID",
    "Action",
    "ActionKind",
    "AgentProtocol",
    "answer_elements",
    "answer_lines",
    "exact_match",
    "f1_score",
    "normalize_answer",
    # settings
    "Config",
    "ModelConfig",
    "SearchConfig",
    "check_table",
    "plugin_settings",
    "setting",
    # errors and exit codes
    "EXIT_DISK",
    "EXIT_ENVIRONMENT_DOWN",
    "EXIT_HEALTH_STOP",
    "REMOTE_FAILURES",
    "ConfigError",
    "ConfigValueError",
    "DiskError",
    "EnvironmentDown",
    "Interrupted",
    "PluginError",
    "RemoteAuthError",
    "RemoteConnectionLost",
    "RemoteError",
    "RemoteHostUnknown",
    "RemoteMalformed",
    "RemoteRateLimited",
    "RemoteRefused",
    "RemoteRejected",
    "RemoteServerError",
    "RemoteStepError",
    "RemoteTLSError",
    "RemoteTimeout",
    "RemoteUnknownModel",
    "SearchR1Error",
    "UserError",
    # logging and secrets
    "get_logger",
    "is_secret_name",
    "redact_text",
    "register_secrets",
    "warn",
    # a module of a plugin that moved: its old path warns its importers
    "moved_module",
    # files: atomic writes, folders, built-in assets
    "COMPLETE",
    "atomic_write",
    "cache_dir",
    "ensure_built",
    "hold_folder",
    "make_temp_dir",
    "make_temp_file",
    "match_umask",
    "resolve_asset",
    "write_text_atomic",
    # stopping, torchrun ranks
    "RankLost",
    "Stop",
    "World",
    "all_reduce_grads",
    "collective",
    # trainers and scripted samplers
    "UNKNOWN",
    "ScriptedSampler",
    "ScriptedTeacher",
    "check_loss",
    "displacement_from_logprobs",
    "merge_train_metrics",
    "mismatch_from_logprobs",
]

offer(__all__)  # an old import of one of these names is told its new import
