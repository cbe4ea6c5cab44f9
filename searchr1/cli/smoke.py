"""``searchr1 smoke``: the reference setup's smoke script as a command
(``docs/reference-setup.md`` §2).

One question (``--question``/``--answer``, else ``[smoke] question`` and ``answers``, else the
reference setup's), ``--group-size`` trajectories (4), at most ``--max-search-calls``
searches each (default: the config's ``rollout.max_search_calls``), through the configured
providers, no parameter update, in a new run folder each time (``--run-dir`` names one). It prints each
trajectory, the search rates and a verdict per criterion (docs/commands.md, exit codes
included).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shlex
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from searchr1.cli.args import add_run_args, whole_number
from searchr1.cli.smoke_verdict import Criterion, key_warnings, reference_criteria, report_only
from searchr1.core.config_schema import Config
from searchr1.core.disk import atomic_write
from searchr1.core.errors import ConfigError, Interrupted, RemoteError, UserError
from searchr1.core.evaluation import EvalResult
from searchr1.core.logs import get_logger, say
from searchr1.core.plugins import PluginError
from searchr1.core.runs import Run
from searchr1.core.secrets import redact_text
from searchr1.core.stop import Stop
from searchr1.core.token_limits import limit_hits
from searchr1.core.types import Question, RewardResult, SearchProvider, Trajectory
from searchr1.defaults import DEFAULT_ANSWERS, DEFAULT_QUESTION
from searchr1.rl.job import Environment

TRAJECTORIES_FILE = "smoke_trajectories.jsonl"
EXIT_CHANNEL_BROKEN = 1
EXIT_CRITERIA_NOT_MET = 3


def main(args: argparse.Namespace, config: Config | None = None) -> int:
    """Run the smoke check; returns the process exit code. ``config`` replaces loading
    ``args.config`` (the Python API and tests that point a loaded file at loopback services)."""
    from searchr1.cli.args import open_run_from_args
    from searchr1.core.plugins import load_registry

    if getattr(args, "answer", None) and not getattr(args, "question", None):
        raise UserError(
            "smoke --answer needs --question (the question those answers belong to); without "
            "--question smoke asks [smoke] question of the config with its own [smoke] answers, "
            "or the reference setup's question"
        )
    if getattr(args, "max_search_calls", None) == 0:
        raise UserError(
            "smoke --max-search-calls 0: smoke checks that every trajectory searches between 1 "
            "and --max-search-calls times, which 0 never passes; give 1 or more, or leave it "
            "out for the config's rollout.max_search_calls"
        )
    if getattr(args, "question", None) and not getattr(args, "answer", None):
        raise UserError(
            "smoke --question needs at least one --answer (the golden answer its rewards are "
            "scored against); without --question smoke asks [smoke] question of the config, or the "
            "reference setup's question (docs/reference-setup.md)"
        )
    with Stop().installed() as stop:
        try:
            registry = getattr(args, "registry", None) or load_registry()
            with open_run_from_args(
                args, "smoke", registry=registry, config=config, stop=stop
            ) as run:
                return _smoke(args, run)
        except Interrupted as stopped:
            again = shlex.join(["searchr1", *sys.argv[1:]]) if sys.argv[1:] else "searchr1 smoke"
            kept = "nothing (smoke keeps no state)"
            raise stopped.outcome(kept, f"run it again: `{again}`") from None


def _smoke(args: argparse.Namespace, run: Run) -> int:
    group_size = int(getattr(args, "group_size", None) or 4)
    max_search = getattr(args, "max_search_calls", None)
    config = run.config
    if max_search is not None:
        config = config.replace(rollout={"max_search_calls": int(max_search)})
    question = smoke_question(args, config)
    say(f"search keys: {search_key_count(config)}")

    async def smoke() -> int:
        """Start the providers, roll out, then judge what came back (one event loop)."""
        failed = await _started(run.start(check=question), config)
        if failed is not None:
            return failed
        try:
            try:
                env = dataclasses.replace(run.env, config=config)
            except BaseException:  # the protocol (a ConfigError): no rollout closes search
                await run.search.aclose()
                raise
            return await _Smoke(env, run.folder, question, group_size).run(run.stop)
        finally:
            await run.aclose()

    return asyncio.run(smoke())


async def _started(start: Awaitable[Any], config: Config) -> int | None:
    """Await the run's ``start``; None once started, else the exit code of a provider that
    cannot even start (a broken channel, said with its diagnosis)."""
    try:
        await start
    except (ConfigError, PluginError, Interrupted):
        raise  # the CLI prints these naming the field (exit 2), or the stop (130/143)
    except Exception as exc:
        if isinstance(exc, RemoteError) and exc.service:  # e.g. the reward judge's check
            say(f"could not reach {exc.service}: {_say(exc)}")
            say(f"diagnosis: {exc.service}: {_model_hint(exc, config.model.provider)}")
            say(f"smoke: FAILED: {exc.service} is not usable (see diagnosis)")
            return EXIT_CHANNEL_BROKEN
        say(f"could not start the providers: {_say(exc)}")
        say("diagnosis: " + _model_hint(exc, config.model.provider, config.model.base_model))
        return 1
    return None


def smoke_question(args: argparse.Namespace, config: Config) -> Question:
    """``--question``/``--answer``, else ``[smoke] question`` and ``answers`` (the offline
    demo's own world), else the reference setup's (which needs real search)."""
    asked = getattr(args, "question", None)
    if asked:
        return Question(id="smoke", question=asked, golden_answers=tuple(args.answer))
    if config.smoke.question.strip():
        return Question(
            id="smoke", question=config.smoke.question, golden_answers=config.smoke.answers
        )
    return Question(id="smoke", question=DEFAULT_QUESTION, golden_answers=DEFAULT_ANSWERS)


class _Smoke:
    def __init__(self, env: Environment, run_dir: Path, question: Question, group_size: int):
        """``env``: the started run's, with smoke's own config (``--max-search-calls``)."""
        self.env, self.config, self.question = env, env.config, question
        self.group_size, self.run_dir = group_size, run_dir
        self.problems: list[str] = []  # diagnoses that make the exit code non-zero
        self.warnings: list[str] = []

    async def run(self, stop: Stop) -> int:
        """Roll out (``stop`` cuts it short), then judge what came back."""
        probe, evaluated, model_error = await stop.cut(self._collect(), "the smoke rollout")
        return self._report(probe, evaluated, model_error)

    def _report(
        self, probe: Any, evaluated: EvalResult | None, model_error: Exception | None
    ) -> int:
        say(
            "search probe: "
            + (f"ok ({len(probe.results)} results)" if probe.ok else f"FAILED ({probe.error})")
        )
        trajectories = evaluated.trajectories if evaluated is not None else []
        results = [r.reward_result for r in (evaluated.records if evaluated is not None else [])]
        for i, (traj, result) in enumerate(zip(trajectories, results, strict=True)):
            say(
                f"trajectory {i}: reward={result.reward:.1f}, search_calls={traj.search_calls}, "
                f"final_answer={traj.final_answer}"
            )
        metrics = self.env.search.metrics()
        # Judged by what was done (the trajectories' searches and the probe), not by the
        # provider's optional metrics.
        calls = 1 + sum(t.search_calls for t in trajectories)
        errors = (not probe.ok) + sum(t.search_errors for t in trajectories)
        success = 1.0 - errors / calls
        say(f"search success rate: {success:.2%}")
        say(f"search error rate: {errors / calls:.2%}")
        self._write(trajectories, results)

        if model_error is not None:
            self.problems.append(
                f"the model channel failed: {_say(model_error)}. "
                + _model_hint(model_error, self.config.model.provider, self.config.model.base_model)
            )
        self._diagnose_search(probe, metrics, success)
        self._diagnose_reward()
        criteria = self._verdict(trajectories, results, success)
        get_logger().info(
            "smoke_done",
            trajectories=len(trajectories),
            rewards=[r.reward for r in results],
            search=metrics,
            problems=self.problems,
            warnings=self.warnings,
            criteria={c.name: c.ok for c in criteria},
            report_only=[c.key for c in criteria if not c.required],
        )
        if self.problems or any(c.channel and not c.ok for c in criteria):
            return EXIT_CHANNEL_BROKEN
        return EXIT_CRITERIA_NOT_MET if not all(c.passed for c in criteria) else 0

    def _verdict(
        self,
        trajectories: Sequence[Trajectory],
        results: Sequence[RewardResult],
        success: float,
    ) -> list[Criterion]:
        """Print warnings, channel diagnoses and the criteria; return the criteria."""
        criteria = reference_criteria(
            trajectories,
            results,
            protocol=self.env.protocol,
            max_search_calls=self.config.rollout.max_search_calls,
            search_success=success,
            min_success_rate=self.config.search.min_success_rate,
        )
        criteria = report_only(criteria, self.config.smoke.report_only)
        hits = limit_hits(
            trajectories,
            max_new_tokens=self.config.model.max_new_tokens,
            max_trajectory_tokens=self.config.rollout.max_trajectory_tokens,
        )
        for line in self.warnings:
            say(f"warning: {line}")
        for line in self.problems:
            say(f"diagnosis: {line}")
        for line in hits.sentences():  # a cut turn reads as invalid: name the setting instead
            say(f"token limit: {line}")
        for criterion in criteria:
            say(criterion.line())
        failed = [c.name for c in criteria if not c.passed]
        if self.problems:
            failed.append("a channel failed (see diagnosis)")
        unmet = [c.key for c in criteria if not c.ok and not c.required]
        if failed:
            say("smoke: FAILED: " + "; ".join(failed))
        elif unmet:
            say(
                "smoke: PASS (the rollout chain works; not required by [smoke] report_only: "
                + ", ".join(unmet)
                + ")"
            )
        else:
            say("smoke: PASS (the rollout chain works as the reference setup describes)")
        return criteria

    async def _collect(self) -> tuple[Any, EvalResult | None, Exception | None]:
        """Probe the search channel once, then roll out and score one group; the search
        provider is closed at the end."""
        from searchr1.core.evaluation import evaluate_run
        from searchr1.rl.rollout import RolloutConfigError

        search: SearchProvider = self.env.search
        try:
            probe = await search.search(self.question.question, self.config.search.top_k)
            evaluated: EvalResult | None = None
            model_error: Exception | None = None
            # Outside the model-channel try: a template whose tool-call format is unknown is
            # the config's problem (exit 2). The description shows the prompt and call format.
            say(self.env.protocol.describe(self.question))
            try:
                evaluated = await evaluate_run(
                    self.env,
                    [self.question],
                    label="smoke",
                    group_size=self.group_size,
                    greedy=False,  # the policy as training samples it
                    seeded=False,
                    id_prefix="",
                    keep_trajectories=True,
                )
            except RolloutConfigError:
                raise  # the config, not the model channel: the CLI names the field (exit 2)
            except Exception as exc:  # the model channel: report it, do not crash
                model_error = exc
            return probe, evaluated, model_error
        finally:
            await search.aclose()

    def _diagnose_search(self, probe: Any, metrics: dict[str, float], success: float) -> None:
        """Channel failures (problems: exit 1) and key rotation notes (warnings)."""
        n_keys = search_key_count(self.config)
        auth = int(metrics.get("auth_errors", 0))
        quota = int(metrics.get("http_429", 0))
        left = metrics.get("keys_available")
        if auth:
            if n_keys == 0:
                self.problems.append(
                    "the search service answered 401/403 and [search] api_keys is empty: set "
                    'api_keys = "${ZHIHU_SEARCH_KEYS}" (comma-separated) and put the keys in '
                    ".env"
                )
            else:
                down = left is not None and left == 0
                (self.problems if down else self.warnings).append(
                    f"401/403: the search service rejected {auth} request(s); a rejected key is "
                    f"benched for the run. Check the keys in [search] api_keys (the variable "
                    f"behind it, e.g. ZHIHU_SEARCH_KEYS) are valid"
                )
        key_warnings_, key_problems = key_warnings(self.env.search)
        self.warnings.extend(key_warnings_)
        self.problems.extend(key_problems)
        if quota and not key_warnings_ and not key_problems:
            keys_left = f"{int(left)} of {max(n_keys, 1)}" if left is not None else "unknown"
            self.warnings.append(
                f"429: search quota exhausted on {quota} request(s); keys left: {keys_left}"
            )
        if not self.env.search.available() and not key_problems:
            self.problems.append(
                "the search provider reports itself unavailable (every key benched): the "
                "search channel is down"
            )
        if not probe.ok and not self.problems:
            failure = probe.failure
            self.problems.append(
                f"the search probe failed: {probe.error}"
                if failure is None
                else f"the search probe failed: {_failure_class(failure)}: {failure}"
            )

    def _diagnose_reward(self) -> None:
        """A reward whose service gave no verdict (the LLM judge): its fallback scored the
        group, so the rewards above say nothing of the judge (a broken channel, exit 1)."""
        from searchr1.core.rewards import reward_metrics, reward_problem

        spend = reward_metrics(self.env.reward)
        failed, calls = int(spend.get("judge/failures", 0)), int(spend.get("judge/calls", 0))
        if not failed:
            return
        fallbacks = int(spend.get("reward/judge_fallbacks", 0))
        why = reward_problem(self.env.reward) or (
            f"the reward judge gave no verdict on {failed} of its {calls} calls "
            "(the judge_failures events say why)"
        )
        self.problems.append(
            f"{why}; {fallbacks} trajectories were scored by reward.judge.fallback instead, so "
            f"the rewards above are not the judge's: check [reward.judge] (api_base, model, "
            f"max_tokens, prompt) and the judge server"
        )

    def _write(self, trajectories: Sequence[Trajectory], results: Sequence[RewardResult]) -> None:
        path = self.run_dir / TRAJECTORIES_FILE
        tok = self.env.sampler.tokenizer
        with atomic_write(path) as fh:
            for traj, result in zip(trajectories, results, strict=True):
                record = traj.to_dict(result)
                record["prompt_text"] = tok.decode(
                    list(traj.tokens[: traj.prompt_len]), skip_special_tokens=False
                )
                record["final_text"] = traj.final_text
                record["protocol"] = self.env.protocol.name
                for turn, out in zip(traj.turns, record["turns"], strict=True):
                    out["stop_reason"] = turn.stop_reason
                    out["sampled_tokens"] = len(turn.sampled_tokens)
                    out["observation_tokens"] = len(turn.observation_tokens)
                record["tokens"] = list(traj.tokens)
                record["generated_mask"] = [int(m) for m in traj.generated_mask]
                record["logprobs"] = list(traj.logprobs)
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        say(f"trajectories written to {path}")


def _say(exc: BaseException) -> str:
    """An exception as one line with secrets redacted."""
    return redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0])


def search_key_count(config: Config) -> int:
    """How many keys ``[search] api_keys`` holds; 0 for a provider without keys."""
    return sum(1 for key in config.search.api_keys if key.strip())


def _failure_class(exc: RemoteError) -> str:
    """``"class dns (the host name does not resolve (DNS))"``: what a diagnosis says first."""
    return f"class {exc.failure} ({exc.summary})"


def _model_hint(exc: BaseException, provider: str, base_model: str = "") -> str:
    """What the model channel's failure means: a remote service's class of failure (read off
    the error, never its text: every message of a retrying client mentions 429), or what
    to check in a local model."""
    if isinstance(exc, RemoteError):
        return f"{_failure_class(exc)}; the message says what to do"
    if not isinstance(exc, OSError | TimeoutError) and provider == "local":
        # The model itself failed (an architecture the code path does not handle, a
        # transformers version mismatch, a broken config.json): name it and the model.
        failed = f"the model {base_model!r} failed inside provider {provider!r}: {_say(exc)}"
        if "target_modules" in str(exc):
            return (
                f'{failed}; likely fix: set [lora] target_modules = "all-linear" (fits every '
                f"family) or to projection names the message lists"
            )
        return (
            f"{failed}; likely fix: check that this transformers version supports the model's "
            f"architecture (pip install -U transformers), that [model] base_model points at a "
            f'complete causal LM folder, and that [lora] target_modules fit it ("all-linear" '
            f"fits every family)"
        )
    return f"check that the model provider {provider!r} can reach its service or files"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("smoke", help="one rollout group through the configured channels")
    add_run_args(p, steps=False)
    p.add_argument("--question", help="the question to ask")
    p.add_argument("--answer", action="append", help="a golden answer (repeatable)")
    p.add_argument(
        "--group-size", type=whole_number(1), default=4, help="trajectories (default: 4)"
    )
    p.add_argument(
        "--max-search-calls",
        type=whole_number(0),
        help="searches per trajectory at most (default: the config's rollout.max_search_calls)",
    )
    p.set_defaults(func=main)
