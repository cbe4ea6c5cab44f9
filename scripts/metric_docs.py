"""The prose of ``docs/reference/metrics.md`` around the metric schema: what to watch in a key
(the schema, :mod:`searchr1.core.metric_schema`, declares every key of the ``metrics`` event
with its meaning, group and merge rule) and what every other event a run writes to
``events.jsonl`` means. ``scripts/gen_docs.py`` writes the page from both, and
:func:`undocumented` fails a test whose run emits a key the schema does not declare or an event
no row here names. A ``<name>`` in a key matches one or more characters that vary (a reward
component, a data source, a key's index)."""

from __future__ import annotations

from searchr1.core.metric_schema import declared

#: what to watch in a key of :data:`~searchr1.core.metric_schema.SCHEMA` (the schema says
#: what each key means and when it is logged)
WATCH: dict[str, str] = {
    "draws/extra": "near `[rollout] max_extra_draws` every step: most questions are too easy or too hard",
    "reward/mean": "the learning curve; should rise",
    "reward/<component>": "`reward/format` rises first (it does not depend on search): if it never rises, the reward, mask or update is broken",
    "reward/judge_vs_em": "far below 1: the judge changes what is rewarded; read a few of its disagreements",
    "reward/judge_fallbacks": "above 0 every step: the judge's channel is failing (see `judge/failures`)",
    "judge/<name>": "`cache_hits` near 0 on a rerun: the cache is off or the prompt changed",
    "degenerate_group_rate": "high: check `search/success_rate` first, then the question mix (troubleshooting)",
    "searches_per_trajectory": "should settle between 1 and `max_search_calls`",
    "end_reason/<reason>": "`token_limit` high: raise `max_trajectory_tokens` or `max_new_tokens`",
    "tokens/trained": "0: the step trained nothing (`no_tokens_trained` notice)",
    "ratio_mean": "1 on-policy; far from 1: see `mismatch/*`",
    "optim/grad_norm": "0 with tokens trained: nothing reaches the adapter",
    "kl/mean": "grows steadily: the policy drifts from where RL began",
    "mismatch/kl_sample_train": "on-policy 0",
    "mismatch/k3": "alert above `[train.health] mismatch_warn_k3`",
    "mismatch/ratio_min": "on-policy 1; alert under 1 / `mismatch_warn_ratio`",
    "mismatch/ratio_max": "on-policy 1; alert above `mismatch_warn_ratio`",
    "mismatch/server<k>/<name>": "one server far above the others serves stale weights",
    "mismatch/logprob_diff_max": "on-policy 0 (float noise); of order 1: sampler and learner run different policies",
    "health/response_growth": "alert past `max_length_growth` (3x)",
    "health/format_rate": "alert when its moving average falls off a cliff",
    "health/format_drop": "rising: the format is being lost",
    "health/repeat_ngram_rate": "rising: loops and stutter",
    "health/entropy": "a cliff: the policy collapses (alert `entropy_cliff`, an entropy collapse)",
    "health/searches/<data_source>": "two-hop sources should search more than one-hop ones; all falling together: alert `search_cliff`",
    "health/follow_up_searches": "a cliff: the policy answers after its first search, multi-hop questions lose their second hop (alert `follow_up_cliff`)",
    "displacement/delta": "above 0 on healthy steps; below 0 for several steps: the collapse is coming (alert `likelihood_displacement`)",
    "displacement/fell_group_frac": "alert when its moving average passes `[train.health] displacement_warn_share` (0.5) with `delta` below 0",
    "llds/active_frac": "near 0 on-policy: LLDS acts where the learner scores a token below the sampler (staleness, mismatch)",
    "search/success_rate": "under `[search] min_success_rate` (0.9) the guard holds the update back",
    "search/error_rate": "climbs with 429s: rotate keys",
    "search/available": "0: the run stops (exit 3)",
    "search/empty_rate": "high: the corpus or the queries do not match",
    "search/http_429": "climbing: a key is over its quota; rotate keys",
    "search/keys_available": "falling: keys are rate limited or rejected",
    "search/key_calls/<i>": "uneven: one key is benched",
    "eval/heldout_em": "the generalisation curve; `keep_best` keeps its best checkpoint",
    "time/step": "the console's s/step and ETA",
    "memory/peak_rss_gb": "near the machine's memory: lower batch or chunk sizes",
    "staleness/mean": "at most `[train] max_staleness`",
}  # fmt: skip

#: numbers no longer in the event because others give them: ``(name, where it is)``
NOT_LOGGED: list[tuple[str, str]] = [
    ("trajectories", "`[rollout] questions_per_batch` x `group_size` (the config)"),
    ("tokens/sampled", "`health/response_tokens` x trajectories"),
    ("turns_per_trajectory", "`searches_per_trajectory` + 1"),
    ("micro_batches", "the datums packed under `[train] max_micro_batch_*` (`time/train` is their cost)"),
]  # fmt: skip

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
        "long work (evals, the cold start, a step's rollouts after 2 s)",
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
        "`kind` (`format_cliff`, `entropy_cliff`, `search_cliff`, `follow_up_cliff`, `likelihood_displacement`, `length_growth`, `mismatch`, `no_tokens_trained`, `max_new_tokens`, `max_trajectory_tokens`) and a message",
    ),
    (
        "guard/no_update",
        "search failed during a step's rollout",
        "the step is retried on the same questions without an update; after `guard_max_waits` the run stops",
    ),
    ("stop_requested", "SIGINT or SIGTERM", "the run stops at the next safe point and saves"),
    (
        "train_stopped",
        "training ended early",
        "why: search down, a health stop, a remote channel failed (its `failure` class and "
        "`exit_code`)",
    ),
    (
        "train_done",
        "the end of training",
        "steps, `stopped_early`, the run totals of the metric schema (`search/paid_calls_total`, `judge/calls_total`, ...) and the run notices' totals (`steps_without_training`, ...)",
    ),
    ("importance_ratio", "start of training", "what the importance ratio compares (temperatures)"),
    ("kl_reference", "start of training with a KL term", "what the KL term is measured against"),
    ("cold_start.step", "each cold-start step", "the supervised loss"),
    ("cold_start.nothing_kept", "the cold start", "no scripted trajectory found the answer"),
    ("cold_start_done", "the end of the cold start", "steps and trajectories it trained on"),
    ("data_malformed_rows", "a QA file is read", "rows skipped as malformed, with examples"),
    (
        "data_fewer_than_a_batch",
        "train starts",
        "`data.train` holds fewer questions than `rollout.questions_per_batch`: each step draws some several times",
    ),
    (
        "question_skipped",
        "a drawn training question's prompt alone fills `rollout.max_trajectory_tokens`",
        "the question and its prompt's tokens: it is skipped, another is drawn",
    ),
    (
        "heldout_in_train",
        "train starts",
        "5% or more of the held-out questions are in `data.train` too: the held-out EM is not held out",
    ),
    (
        "resume_base_model_changed",
        "`--resume`",
        "the checkpoint was trained on another `model.base_model`",
    ),
    ("resume_nothing_to_train", "`--resume`", "the checkpoint is at or past `train.max_steps`"),
    (
        "resume_fresh_start",
        "`--resume` of a run that stopped before its first checkpoint",
        "nothing was trained there: the run starts from step 1",
    ),
    (
        "checkpoint_failed",
        "a stop's checkpoint of the last trained step fails too (a full disk)",
        "the step, the save's error and the stop's; the last complete checkpoint stands",
    ),
    (
        "stale_save_removed",
        "train starts",
        "a hidden folder a killed checkpoint save left, removed",
    ),
    ("stopped", "a stop ends train", "the signal, the phase it came in and the last checkpoint"),
    (
        "rollout_discarded",
        "a pipelined run ends",
        "a prefetched rollout that failed after the loop stopped reading it",
    ),
    (
        "cache_damaged",
        "a cached built-in asset is read",
        "the folder and the problem: discarded and built again",
    ),
    (
        "hub_unreachable",
        "a hub id is loaded and the hub does not answer",
        "why; the model loads from this machine's cache alone",
    ),
    (
        "remote_connecting",
        "the first request to a remote service",
        "its address, the timeout and the retries it is given",
    ),
    (
        "search_failed",
        "a search request failed for good (once per failure class)",
        "the provider, the `failure` class and the detail",
    ),
    (
        "judge_failures",
        "a batch of judge calls had failures",
        "how many of the calls, the answers left without a verdict (`without_verdict`, each "
        "scored by the fallback), the judge's address and the last error",
    ),
    (
        "heldout_untrusted",
        "a held-out eval inside `train` searched with success under `search.min_success_rate`",
        "which eval (`when`, `step`) and the search success: its scores are not trustworthy "
        "(as `searchr1 eval` flags them)",
    ),
    (
        "judge_checked",
        "`train`, `smoke` and `eval` start with the judge reward",
        "the judge answered its one call before the rollout (address, model, verdict)",
    ),
    (
        "eval_judge",
        "`eval --judge`, after each model",
        "the judge's spend and agreement for that model",
    ),
    (
        "plugin_check_failed",
        "a plugin's `check` raised",
        "the plugin and the error (its factory meets the problem when the run creates it)",
    ),
    (
        "index_build_restarted",
        "`index build` resumes a build it cannot continue",
        "why; the build starts over",
    ),
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
    (
        "asset_building",
        "first use of a `builtin:` asset or a .gguf model",
        "what is built, why, about how long it takes and the cache folder it goes to",
    ),
    ("asset_built", "the build ends", "what was built, in how many seconds, and where"),
    (
        "asset_waiting",
        "another process is building the same asset",
        "the asset and its folder; it waits, then uses what the other built",
    ),
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
    (
        "vllm_server_not_ready",
        "a vLLM server this run did not launch is not ready at once",
        "why (a refused connection, a status); the run waits for it up to `startup_timeout_s`",
    ),
    (
        "vllm_server_starting",
        "every 15 s of waiting for a vLLM server to be ready",
        "the seconds waited, the timeout, why it is not ready and a launched server's last log line",
    ),
    ("vllm_ready", "the vllm provider", "the server(s) answer"),
    ("vllm_server_stopped", "the end of a run", "a launched server stopped"),
    ("vllm_server_kill", "a server did not stop", "it was killed"),
    ("vllm_unload_failed", "after an adapter update", "the previous adapter could not be unloaded"),
    ("http_retry", "an HTTP request is retried", "the URL (never a key), the attempt and the wait"),
    (
        "search_key_benched",
        "a key answers 429/401/403 or keeps failing",
        'its index (never the key), why, `benched_for_s` (or `benched_for = "the run"`); once a bench, however many calls met it',
    ),
    ("search_key_unbenched", "a benched key's time is up", "its index"),
    ("search_key_healthy", "a probed key works again", "its index"),
    ("search_environment_down", "every key is benched", "search cannot serve"),
    (
        "judge_key_benched",
        "a judge key answers 429/401/403",
        'its index (never the key), why, `benched_for_s` (or `benched_for = "the run"`); once a bench, however many calls met it',
    ),
    ("judge_key_unbenched", "a benched judge key's time is up", "its index"),
    ("judge_key_healthy", "a probed judge key works again", "its index"),
    ("judge_down", "every judge key is benched", "the judge cannot give verdicts"),
    ("search_raised", "a search provider raised", "the error (counted as a failed search)"),
    ("search_internal_error", "a search provider failed inside", "the error"),
    ("search_disk_cache_off", "the disk cache cannot be used", "why; searches are asked again"),
    (
        "search_disk_cache_damaged",
        "the disk cache's database is damaged",
        "the file; it is discarded and a new one started",
    ),
    (
        "search_disk_cache_old_format",
        "an earlier version's single-file cache is found",
        "the file; it is removed and a folder started",
    ),
    (
        "judge_disk_cache_off",
        "the judge's disk cache cannot be used",
        "why; verdicts are asked again",
    ),
    (
        "judge_disk_cache_damaged",
        "the judge's disk cache is damaged",
        "the file; it is discarded and a new one started",
    ),
    (
        "judge_disk_cache_old_format",
        "an earlier version's single-file cache is found",
        "the file; it is removed and a folder started",
    ),
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


#: fields every event carries
COMMON = frozenset({"event", "run_id", "level", "timestamp"})


def undocumented(events: list[dict]) -> list[str]:
    """The event names no row above describes and the ``metrics`` keys the schema
    (:data:`~searchr1.core.metric_schema.SCHEMA`) does not declare, in ``events``."""
    names = {name for name, *_ in EVENTS}
    missing: set[str] = set()
    for event in events:
        name = str(event.get("event", ""))
        if name not in names:
            missing.add(f"event {name}")
        if name == "metrics":
            missing.update(f"metric {k}" for k in set(event) - COMMON if declared(k) is None)
    return sorted(missing)
