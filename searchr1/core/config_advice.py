"""What a config leaves unsaid, and what the chosen provider cannot honour.

:func:`searchr1.core.config.parse_config` calls :func:`infer_choices` on the raw TOML before
validation, so a config written like the seed's skeleton -- ``[model] api_base`` + ``api_key``
and no ``provider``; no ``[rollout] protocol`` -- runs what the seed describes:

* ``[model] provider`` absent: ``taotoken`` when ``[model]`` sets ``api_base`` or ``api_key``
  (the seed: "sampling and training both go through TaoToken"), else ``local``.
* ``[rollout] protocol`` absent: ``tool_calls`` (the model calls a ``search`` tool through its
  chat template and ends with an ``Answer: ...`` line, as the seed's troubleshooting reads).
* ``[train] max_staleness`` absent: ``1`` with a remote training provider (``taotoken``,
  ``tinker``), where every step waits on the service and on search in turn, so overlapping the
  next step's rollouts with this step's training pays (``bench/pipeline.py``: 1.6x s/step with
  service and search latency, learning intact); ``0`` (synchronous) otherwise, where sampling
  and training share this machine's cores and overlap gains nothing (0.98x on the demo).

It also calls :func:`literal_secret_warnings`. :func:`unhonoured_settings` is called by
``config check``, ``smoke`` and ``train`` (through :func:`searchr1.core.runs.open_run`) to name
every setting the chosen model provider ignores or maps differently, and what happens instead;
:func:`provider_warnings` adds what the provider's factory itself checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

#: providers that sample and train on a remote Tinker-shaped service
REMOTE_TRAINING = ("taotoken", "tinker")
#: providers whose learner is the in-process one (``plugins/local_model/learner.py``)
LOCAL_TRAINING = ("local", "vllm")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
#: the environment variable a literal secret should move to, per secret field
_SECRET_VARS = {"model.api_key": "TAOTOKEN_API_KEY", "search.api_keys": "ZHIHU_SEARCH_KEYS"}


def infer_choices(raw: dict[str, Any], where: Callable[[str], str]) -> dict[str, str]:
    """Fill ``model.provider``, ``rollout.protocol`` and ``train.max_staleness`` in ``raw`` when
    the file leaves them out; return ``dotted field -> why it has its value`` for each (printed
    by config check)."""
    reasons: dict[str, str] = {}
    model = raw.get("model")
    model = model if isinstance(model, dict) else {}
    if "provider" in model:
        reasons["model.provider"] = f"set in {where('model.provider')}"
    else:
        remote = [k for k in ("api_base", "api_key") if str(model.get(k, "")).strip()]
        if remote:
            value = "taotoken"
            why = (
                f"[model] sets {' and '.join(remote)} and no provider: sampling and training go "
                f"through the TaoToken service (the seed's setup)"
            )
        else:
            value = "local"
            why = "[model] sets no provider, api_base or api_key: the model runs in this process"
        if isinstance(raw.get("model"), dict):
            raw["model"]["provider"] = value
        elif "model" not in raw:
            raw["model"] = {"provider": value}
        reasons["model.provider"] = f"not set; {why}"
    rollout = raw.get("rollout")
    if isinstance(rollout, dict) and "protocol" in rollout:
        reasons["rollout.protocol"] = f"set in {where('rollout.protocol')}"
    else:
        reasons["rollout.protocol"] = (
            "not set; the default: the model calls the search tool through its chat template "
            "and ends with one `Answer: ...` line (the seed's format)"
        )
    _infer_staleness(raw, where, reasons)
    return reasons


def _infer_staleness(
    raw: dict[str, Any], where: Callable[[str], str], reasons: dict[str, str]
) -> None:
    train = raw.get("train")
    if isinstance(train, dict) and "max_staleness" in train:
        reasons["train.max_staleness"] = f"set in {where('train.max_staleness')}"
        return
    model = raw.get("model")
    provider = model.get("provider") if isinstance(model, dict) else None
    if provider not in REMOTE_TRAINING:
        reasons["train.max_staleness"] = "not set; 0: synchronous steps (the provider is local)"
        return
    if isinstance(train, dict):
        train["max_staleness"] = 1
    elif "train" not in raw:
        raw["train"] = {"max_staleness": 1}
    reasons["train.max_staleness"] = (
        f"not set; 1 for provider {provider!r}: the next step's rollouts run while the service "
        f"trains this one (docs/benchmarks.md, pipelined steps)"
    )


def literal_secret_warnings(
    config_fields: Mapping[str, Any], variables: Mapping[str, str], where: Callable[[str], str]
) -> list[str]:
    """A warning for each secret field written literally instead of as ``${VAR}``.

    ``config_fields`` maps a secret's dotted name to its value; ``variables`` the dotted names
    that were filled from a variable."""
    out = []
    for dotted, value in config_fields.items():
        if not value or dotted in variables:
            continue
        var = _SECRET_VARS.get(dotted, dotted.replace(".", "_").upper())
        section, key = dotted.split(".", 1)
        out.append(
            f"{where(dotted)}: {dotted} holds a literal secret: a config file is easy to commit "
            f'and share. Write [{section}] {key} = "${{{var}}}" and put {var}=... in a .env '
            f"file next to the config (never committed)"
        )
    return out


def unhonoured_settings(config: Config) -> list[str]:
    """Every setting of ``config`` that its model provider ignores or maps coarsely, each
    with what happens instead; the seed's remote temperature note included."""
    provider = config.model.provider
    out: list[str] = []
    explicit = config.explicit
    if provider == "local":
        for key in ("api_base", "api_key"):
            if getattr(config.model, key):
                out.append(
                    f"model.{key} is ignored by provider 'local' (the model runs in this "
                    f'process); remove provider or set provider = "taotoken" to use the service'
                )
    if provider in LOCAL_TRAINING and config.lora.dropout > 0:
        out.append(
            f"lora.dropout = {config.lora.dropout:g} has no effect on provider {provider!r}: the "
            f"learner scores the policy with dropout off, as the sampler runs it, so on-policy "
            f"importance ratios are 1 (a dropout-thinned learner put them up to 1.10 at 0.05)"
        )
    if provider == "vllm" and config.model.top_p < 1.0:
        out.append(
            f"model.top_p = {config.model.top_p:g} on provider 'vllm': vLLM reports log-probs of "
            f"the top-p renormalised distribution, the learner's are before truncation, so "
            f"ratios sit below 1 by the kept mass (see mismatch/*); top_p = 1.0 matches exactly"
        )
    if config.search.provider == "local":
        for key in ("api_keys", "api_base"):
            if getattr(config.search, key):
                out.append(
                    f"search.{key} is ignored by search provider 'local' (BM25 over "
                    f"[search.local] corpus on this machine)"
                )
    if provider in REMOTE_TRAINING:
        out.extend(_remote_lora(config, provider))
        for key in ("device", "dtype"):
            if f"model.{key}" in explicit:
                out.append(
                    f"model.{key} is ignored by provider {provider!r}: the service chooses where "
                    f"and in which precision the model runs"
                )
        if config.model.temperature != 1.0:
            out.append(temperature_note(config))
    return out


def provider_warnings(config: Config, registry: Any) -> list[str]:
    """What the chosen model provider's factory says about this config before it runs: a
    factory may carry a ``config_warnings(config) -> list[str]`` attribute (see
    :func:`searchr1.core.hookspecs.register_model_providers`; e.g. LoRA targets that leave
    whole layer types of the model out). Called by ``config check`` and, through
    :func:`searchr1.core.runs.announce_config`, by ``smoke`` and ``train``. A check that
    fails is no warning: the run's own load reports what is wrong."""
    try:
        factory = registry.get("model_provider", config.model.provider).factory
    except Exception:  # an unknown provider is named by check_plugin_choices
        return []
    check = getattr(factory, "config_warnings", None)
    if not callable(check):
        return []
    try:
        return [str(line) for line in check(config)]
    except Exception:
        return []


def temperature_note(config: Config) -> str:
    """What the importance ratio compares when a remote service samples at ``temperature``
    but trains untempered; said at start of every run, the run goes on."""
    t = config.model.temperature
    return (
        f"model.temperature = {t:g} on provider {config.model.provider!r}: the service samples "
        f"at temperature {t:g} but computes the learner's log-probs untempered (T = 1), so the "
        f"importance ratio exp(learner - sampler) compares the untempered policy with the "
        f"tempered sampling distribution and is not 1 even on-policy. The run uses {t:g} as "
        f"set; each step's metrics log the gap as mismatch/kl_sample_train and ratio_mean "
        f"(0 and 1.0 when both agree)"
    )


def _remote_lora(config: Config, provider: str) -> list[str]:
    out = []
    lora, explicit = config.lora, config.explicit
    if "lora.alpha" in explicit:
        out.append(
            f"lora.alpha = {lora.alpha:g} is not sent to provider {provider!r} (its SDK has no "
            f"such parameter): the service applies its own LoRA scaling"
        )
    if "lora.dropout" in explicit:
        out.append(
            f"lora.dropout = {lora.dropout:g} is not sent to provider {provider!r} (its SDK has "
            f"no such parameter): the service applies its own dropout (if any)"
        )
    targets = set(lora.target_modules)
    groups = {"attention": _ATTN, "MLP": _MLP, "unembedding": ("lm_head",)}
    partial = [
        f"{name} ({', '.join(mods)})"
        for name, mods in groups.items()
        if targets & set(mods) and not set(mods) <= targets
    ]
    unknown = sorted(targets - set(_ATTN) - set(_MLP) - {"lm_head"})
    if partial:
        out.append(
            f"lora.target_modules = {list(lora.target_modules)} is mapped to whole layer groups "
            f"by provider {provider!r}: it adapts every module of {'; '.join(partial)}"
        )
    if unknown:
        out.append(
            f"lora.target_modules {unknown} have no counterpart on provider {provider!r} (it "
            f"adapts attention, MLP and unembedding groups only): they are ignored"
        )
    return out
