"""What every metric and event a run writes to ``events.jsonl`` means: the one place they are
described. ``scripts/gen_docs.py`` writes ``docs/reference/metrics.md`` from these tables, and
``tests/helpers/documented.py`` fails a test whose run emits a key or an event named here by no
row. A ``<name>`` in a key matches one or more characters that vary (a reward component, a data
source, a key's index)."""

from __future__ import annotations

import re

#: ``(key, when it is in the metrics event, what it means, what to watch)``
METRICS: list[tuple[str, str, str, str]] = [
    # --- the step
    ("step", "every step", "the RL step (1-based)", ""),
    (
        "world_size",
        "under torchrun",
        "processes of the job; the other numbers count every rank's",
        "",
    ),
    ("groups", "every step", "groups trained this step (one per question)", ""),
    ("trajectories", "every step", "trajectories of the step's first draw", ""),
    (
        "draws/extra",
        "every step",
        "extra questions dynamic sampling drew to replace degenerate groups",
        "near `[rollout] max_extra_draws` every step: most questions are too easy or too hard",
    ),
    # --- rewards
    (
        "reward/mean",
        "every step",
        "mean reward of the first draw (an unbiased sample of the policy)",
        "the learning curve; should rise",
    ),
    (
        "reward/trained_mean",
        "every step",
        "mean reward of the groups trained (after dynamic sampling)",
        "",
    ),
    (
        "reward/<component>",
        "every step",
        "mean of a reward component: `format` (answered in the format), `correct` (exact match), `f1` (token F1, a metric only), and any shaping term's",
        "`reward/format` rises first (it does not depend on search): if it never rises, the reward, mask or update is broken",
    ),
    (
        "reward/judge_vs_em",
        '`[reward] name = "judge"` (or a judge term)',
        "share of judged trajectories where the judge's verdict agrees with exact match",
        "far below 1: the judge changes what is rewarded; read a few of its disagreements",
    ),
    (
        "reward/judge_fallbacks",
        "with a judge",
        "trajectories scored by `[reward.judge] fallback` because the judge gave no verdict",
        "above 0 every step: the judge's channel is failing (see `judge/failures`)",
    ),
    (
        "judge/<name>",
        "with a judge",
        "the step's judge spend: `calls`, `cache_hits`, `disk_hits`, `failures`, `unparsed` (replies with no verdict), `tokens_in`, `tokens_out`, `cost` (with `price_in`/`price_out` set); `*_total` the same over the run",
        "`cache_hits` near 0 on a rerun: the cache is off or the prompt changed",
    ),
    (
        "degenerate_group_rate",
        "every step",
        "share of the first draw's groups whose rewards are all equal: no gradient",
        "high: check `search/success_rate` first, then the question mix (troubleshooting)",
    ),
    # --- behaviour
    ("search_rate", "every step", "share of trajectories that searched at least once", ""),
    (
        "searches_per_trajectory",
        "every step",
        "mean searches per trajectory",
        "should settle between 1 and `max_search_calls`",
    ),
    ("turns_per_trajectory", "every step", "mean assistant turns per trajectory", ""),
    (
        "end_reason/<reason>",
        "every step",
        "share of trajectories that ended `answered`, at the `search_limit`, the `turn_limit`, the `token_limit`, or with an `invalid_action`",
        "`token_limit` high: raise `max_trajectory_tokens` or `max_new_tokens`",
    ),
    ("tokens/sampled", "every step", "tokens the policy sampled (the trainable ones)", ""),
    (
        "tokens/trajectory_mean",
        "every step",
        "mean length of a trajectory, prompt and search results included",
        "",
    ),
    (
        "tokens/trained",
        "every step",
        "tokens that entered the loss (non-zero advantage, or a KL term)",
        "0: the step trained nothing (`no_tokens_trained` notice)",
    ),
    # --- the update
    ("loss", "every step", "the policy loss summed over micro-batches", ""),
    ("micro_batches", "every step", "micro-batches sent to the learner", ""),
    (
        "ratio_mean",
        "every step",
        "mean importance ratio learner / sampler over trained tokens",
        "1 on-policy; far from 1: see `mismatch/*`",
    ),
    (
        "clip_fraction",
        "every step",
        "share of trained tokens whose ratio the loss clipped (ppo, cispo)",
        "",
    ),
    (
        "optim/<name>",
        "every step with an update",
        "the optimizer step: `grad_norm` (before clipping), `lr`, `step` (the adapter's version)",
        "`grad_norm` 0 with tokens trained: nothing reaches the adapter",
    ),
    (
        "kl/mean",
        "`[train.loss] kl_coef > 0`",
        "the KL term's k3 estimate per token it read (policy vs the start policy)",
        "grows steadily: the policy drifts from where RL began",
    ),
    ("kl/max", "`[train.loss] kl_coef > 0`", "the largest per-token k3 of the step", ""),
    # --- sampler vs learner
    (
        "mismatch/tokens",
        "the learner reports log-probs",
        "trained tokens the mismatch numbers are over",
        "",
    ),
    (
        "mismatch/logprob_diff_max",
        "the learner reports log-probs",
        "largest per-token gap between the learner's and the sampler's log-prob",
        "on-policy 0 (float noise); of order 1: sampler and learner run different policies",
    ),
    (
        "mismatch/kl_sample_train",
        "the learner reports log-probs",
        "mean sampler log-prob minus learner log-prob",
        "on-policy 0",
    ),
    (
        "mismatch/k3",
        "the learner reports log-probs",
        "mean k3 KL estimate, sampler vs learner",
        "alert above `[train.health] mismatch_warn_k3`",
    ),
    (
        "mismatch/ratio_min",
        "the learner reports log-probs",
        "smallest per-token ratio learner / sampler",
        "on-policy 1; alert under 1 / `mismatch_warn_ratio`",
    ),
    (
        "mismatch/ratio_max",
        "the learner reports log-probs",
        "largest per-token ratio",
        "on-policy 1; alert above `mismatch_warn_ratio`",
    ),
    (
        "mismatch/server<k>/<name>",
        "vllm with several servers",
        "the same numbers for sampling server k (in the order of `api_bases`)",
        "one server far above the others serves stale weights",
    ),
    # --- health
    ("health/response_tokens", "every step", "sampled tokens per trajectory", ""),
    (
        "health/response_growth",
        "every step",
        "that over its mean across the first `baseline_steps`",
        "alert past `max_length_growth` (3x)",
    ),
    (
        "health/format_rate",
        "every step",
        "share of trajectories answered in the protocol's format (the console's `format`)",
        "alert when its moving average falls off a cliff",
    ),
    (
        "health/format_drop",
        "every step",
        "running peak of the format rate's moving average minus its current value",
        "rising: the format is being lost",
    ),
    (
        "health/repeat_ngram_rate",
        "every step",
        "share of sampled n-grams already seen earlier in the same trajectory",
        "rising: loops and stutter",
    ),
    (
        "health/entropy",
        "every step",
        "mean -log p of the sampled tokens (an entropy estimate)",
        "a cliff: the policy collapses",
    ),
    (
        "health/searches/<data_source>",
        "every step",
        "searches per question of each data source",
        "two-hop sources should search more than one-hop ones",
    ),
    ("health/alerts", "every step", "health alerts this step raised (`health_alert` events)", ""),
    # --- search
    ("search/calls", "every step", "searches asked", ""),
    (
        "search/success_rate",
        "every step",
        "share of valid searches that got an answer",
        "under `[search] min_success_rate` (0.9) the guard holds the update back",
    ),
    (
        "search/error_rate",
        "every step",
        "share of valid searches that failed",
        "climbs with 429s: rotate keys",
    ),
    ("search/errors", "every step", "searches that failed", ""),
    (
        "search/available",
        "every step",
        "1 while the provider can serve, 0 when every key is benched",
        "0: the run stops (exit 3)",
    ),
    ("search/latency_p50", "every step", "median search latency, seconds", ""),
    ("search/latency_p95", "every step", "95th percentile search latency, seconds", ""),
    ("search/results_per_call", "every step", "results per answered search", ""),
    (
        "search/empty_rate",
        "every step",
        "share of searches answered with no result",
        "high: the corpus or the queries do not match",
    ),
    ("search/invalid_queries", "every step", "empty or unusable queries (not sent)", ""),
    ("search/truncated_queries", "every step", "queries cut to `[search] max_query_chars`", ""),
    ("search/cache_hits", "every step", "searches answered from this run's memory", ""),
    ("search/cache_hit_rate", "every step", "share of valid searches answered from memory", ""),
    ("search/disk_hits", "every step", "searches answered from the disk cache of earlier runs", ""),
    ("search/disk_hits_total", "every step", "the same over the run", ""),
    ("search/paid_calls", "every step", "searches sent to the service", ""),
    ("search/paid_calls_total", "every step", "the same over the run", ""),
    ("search/cost", "`[search] cost_per_call` set", "`paid_calls` x `cost_per_call`", ""),
    ("search/cost_total", "`[search] cost_per_call` set", "the same over the run", ""),
    ("search/attempts", "every step", "HTTP requests sent (retries and key switches included)", ""),
    (
        "search/retries",
        "every step",
        "requests retried after a timeout, connection error or 5xx",
        "",
    ),
    (
        "search/key_retries",
        "every step",
        "requests asked again with the next key after an unusable answer",
        "",
    ),
    (
        "search/http_429",
        "every step",
        "answers 429 (rate limited)",
        "climbing: a key is over its quota; rotate keys",
    ),
    ("search/429_rate", "every step", "share of attempts answered 429", ""),
    ("search/auth_errors", "every step", "answers 401/403 (the key was rejected)", ""),
    ("search/timeouts", "every step", "attempts that timed out", ""),
    ("search/timeout_rate", "every step", "share of attempts that timed out", ""),
    ("search/connection_errors", "every step", "attempts that could not connect", ""),
    ("search/server_errors", "every step", "answers 5xx", ""),
    ("search/http_errors", "every step", "other HTTP error answers", ""),
    ("search/malformed_responses", "every step", "answers whose body could not be read", ""),
    ("search/api_errors", "every step", "API errors inside a 200 answer", ""),
    ("search/unavailable", "every step", "searches refused because every key was benched", ""),
    (
        "search/keys_available",
        "a keyed HTTP service",
        "keys not benched",
        "falling: keys are rate limited or rejected",
    ),
    (
        "search/key_calls/<i>",
        "a keyed HTTP service",
        "requests sent with key i (by index, never the key)",
        "uneven: one key is benched",
    ),
    # --- held-out eval during training
    (
        "eval/heldout_em",
        "`[train] eval_every` steps",
        "held-out exact match of the periodic eval (also its own `eval/heldout_em` event)",
        "the generalisation curve; `keep_best` keeps its best checkpoint",
    ),
    (
        "eval/heldout_format_rate",
        "`[train] eval_every` steps",
        "held-out share answered in the format",
        "",
    ),
    (
        "eval/heldout_search_calls_mean",
        "`[train] eval_every` steps",
        "held-out searches per question",
        "",
    ),
    (
        "eval/heldout_em/<source>",
        "`[train] eval_every` steps",
        "held-out exact match of each data source",
        "",
    ),
    # --- time and memory
    ("time/rollout", "every step", "seconds of rollouts (sampling + search + reward)", ""),
    ("time/train", "every step", "seconds of the learner (forward/backward + optimizer step)", ""),
    ("time/step", "every step", "seconds of the whole step", "the console's s/step and ETA"),
    (
        "memory/peak_rss_gb",
        "every step",
        "this process's peak resident memory so far, GiB",
        "near the machine's memory: lower batch or chunk sizes",
    ),
    (
        "staleness/mean",
        "every step",
        "mean of (policy version trained on - version that sampled) over the step's trajectories",
        "0 synchronous; at most `[train] max_staleness`",
    ),
    ("staleness/max", "every step", "the largest staleness of the step", ""),
    (
        "pipeline/trainer_idle_frac",
        "every step",
        "share of the step's window the trainer waited for rollouts",
        "",
    ),
    ("pipeline/sampler_idle_frac", "every step", "share of the window the sampler waited", ""),
    (
        "pipeline/overlap_s",
        "every step",
        "seconds of rollouts that overlapped training (pipelined steps)",
        "",
    ),
]

#: ``(event, when it is written, what it says)``; every event has ``run_id``, ``level`` and
#: ``timestamp`` too
EVENTS: list[tuple[str, str, str]] = [
    (
        "run_start",
        "a command opens its run folder",
        "the command, the run folder and the config's source",
    ),
    (
        "config_choice",
        "a setting was inferred",
        "the field, its value and why (e.g. the provider chosen from `api_base`)",
    ),
    (
        "config_warning",
        "start of a run",
        "a setting the chosen plugins cannot honour, a literal secret, an empty exported variable",
    ),
    ("metrics", "once per RL step", "the numbers above"),
    (
        "progress",
        "long work (evals, the cold start)",
        "`task`, `done`, `total`: a progress bar on a terminal",
    ),
    (
        "eval/heldout_em",
        "the held-out evals: `before`, `ceiling` (the eval set's ideal agent), `cold_start`, `step_N`, `after`",
        "the eval's numbers, as `eval_result` (`em`, `macro_em`, `f1`, `format_rate`, `search_calls_mean`, `search_success_rate`, `n`, ...; per source `em/<source>`, `f1/<source>`, ...), and `seconds`",
    ),
    ("checkpoint", "a checkpoint is saved", "its step and folder"),
    ("best_checkpoint", "the end of a `keep_best` run", "the best held-out EM's step (`RUN:best`)"),
    ("best_checkpoint_unreadable", "a `keep_best` resume", "the saved best could not be read"),
    ("checkpoint_damaged", "`--resume`", "a damaged newest checkpoint, named and skipped"),
    ("resumed", "`--resume`", "the step and checkpoint the run continues from"),
    (
        "disk_space_low",
        "before a checkpoint",
        "the free space is under twice the last checkpoint's size",
    ),
    (
        "health_alert",
        "a health check or a run notice fires",
        "`kind` (`format_cliff`, `entropy_cliff`, `length_growth`, `mismatch`, `no_tokens_trained`, `max_new_tokens`, `max_trajectory_tokens`) and a message",
    ),
    (
        "guard/no_update",
        "search failed during a step's rollout",
        "the step is retried on the same questions without an update; after `guard_max_waits` the run stops",
    ),
    ("stop_requested", "SIGINT or SIGTERM", "the run stops at the next safe point and saves"),
    ("train_stopped", "training ended early", "why: search down, a health stop"),
    (
        "train_done",
        "the end of training",
        "steps, `stopped_early` and the run notices' totals (`steps_without_training`, ...)",
    ),
    ("importance_ratio", "start of training", "what the importance ratio compares (temperatures)"),
    ("kl_reference", "start of training with a KL term", "what the KL term is measured against"),
    ("cold_start.step", "each cold-start step", "the supervised loss"),
    ("cold_start.nothing_kept", "the cold start", "no scripted trajectory found the answer"),
    ("cold_start_done", "the end of the cold start", "steps and trajectories it trained on"),
    ("data_malformed_rows", "a QA file is read", "rows skipped as malformed, with examples"),
    (
        "lora_coverage",
        "the local model loads",
        "the layers the LoRA adapter covers, per layer type",
    ),
    (
        "local_model_loaded",
        "the local model loads",
        "device, dtype, threads, trainable parameters, the sampler's token budget",
    ),
    ("learner_dropout_off", "the local learner starts", "LoRA dropout is not applied when scoring"),
    (
        "learner_logits_fallback",
        "the local learner",
        "the model's forward gives whole logits: the chunked projection is off",
    ),
    ("learner_shared_prefix_off", "the local learner", "prompt sharing is off for this model"),
    ("fsdp_sharded", "`[model.local] fsdp = true`", "how the model was sharded"),
    (
        "gated_deltanet_slow_kernels",
        "a Qwen3.5 model loads without its kernels",
        "the packages that make it fast",
    ),
    ("gguf.converting", "first use of a .gguf model", "the conversion into a loadable folder"),
    ("remote_model_ready", "a remote provider connects", "the service, the SDK and the model"),
    (
        "remote_temperature_not_1",
        "a remote provider at temperature != 1",
        "the ratio compares an untempered learner with a tempered sampler",
    ),
    ("remote_checkpoint_saved", "a remote checkpoint", "where the service saved the state"),
    ("remote_checkpoint_loaded", "`--resume` on a remote provider", "the state loaded"),
    (
        "remote_checkpoint_other_service",
        "`--resume` on a remote provider",
        "the checkpoint was written by another service",
    ),
    (
        "remote_close_failed",
        "the end of a remote run",
        "closing the session failed (the run's results are kept)",
    ),
    ("vllm_server_launched", "the vllm provider launches a server", "its command and address"),
    ("vllm_ready", "the vllm provider", "the server(s) answer"),
    ("vllm_server_stopped", "the end of a run", "a launched server stopped"),
    ("vllm_server_kill", "a server did not stop", "it was killed"),
    ("vllm_unload_failed", "after an adapter update", "the previous adapter could not be unloaded"),
    ("http_retry", "an HTTP request is retried", "the URL (never a key), the attempt and the wait"),
    (
        "search_key_benched",
        "a key answers 429/401/403 or keeps failing",
        "its index (never the key) and for how long",
    ),
    ("search_key_unbenched", "a benched key's time is up", "its index"),
    ("search_key_healthy", "a probed key works again", "its index"),
    ("search_environment_down", "every key is benched", "search cannot serve"),
    ("search_raised", "a search provider raised", "the error (counted as a failed search)"),
    ("search_internal_error", "a search provider failed inside", "the error"),
    ("search_disk_cache_off", "the disk cache cannot be used", "why; searches are asked again"),
    (
        "search_index_built",
        "the local BM25 index is built",
        "the corpus and where the index is kept",
    ),
    ("search_index_not_cached", "the BM25 index cannot be saved", "why; it is rebuilt next time"),
    ("search_index_unreadable", "a saved BM25 index cannot be read", "it is rebuilt"),
    (
        "sink_failed",
        "a metric sink fails the first time",
        "the sink and the error; training goes on",
    ),
    ("sink_failures", "the end of a run", "how many times each sink failed"),
    ("smoke_done", "the end of `searchr1 smoke`", "the verdict"),
    ("eval_start", "`searchr1 eval` starts", "what is evaluated, on which data"),
    ("eval_result", "`searchr1 eval`, per model", "its EM/F1/format/search rates"),
]


def _pattern(key: str) -> re.Pattern[str]:
    parts = re.split(r"<[a-z_]+>", key)
    return re.compile(".+".join(re.escape(p) for p in parts) + r"\Z")


_METRIC_PATTERNS = [_pattern(key) for key, *_ in METRICS]
_EVENT_NAMES = {name for name, *_ in EVENTS}
#: fields every event carries
COMMON = frozenset({"event", "run_id", "level", "timestamp"})


def undocumented(events: list[dict]) -> list[str]:
    """The event names and ``metrics`` keys in ``events`` that no row above describes."""
    missing: set[str] = set()
    for event in events:
        name = str(event.get("event", ""))
        if name not in _EVENT_NAMES:
            missing.add(f"event {name}")
        if name == "metrics":
            for key in set(event) - COMMON:
                if not any(p.match(key) for p in _METRIC_PATTERNS):
                    missing.add(f"metric {key}")
    return sorted(missing)
