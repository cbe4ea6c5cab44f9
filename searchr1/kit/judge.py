"""An LLM judge over an OpenAI-compatible chat API: is a predicted answer right, given the
question and the golden answers? Used by the ``judge`` reward and ``searchr1 eval --judge``
(``docs/rewards.md``).

:meth:`Judge.judge_many` scores one batch (a step's trajectories, an eval chunk).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from searchr1.kit.http import Channel, HttpClient, HttpError, RetryPolicy, Verdict, safe_url
from searchr1.kit.memo import Memo
from searchr1.kit.retry import is_retryable_status, parse_retry_after
from searchr1.kit.search.keys import KeyPool
from searchr1.sdk import (
    RemoteAuthError,
    RemoteError,
    RemoteMalformed,
    RemoteRateLimited,
    get_logger,
    redact_text,
)

#: the default prompt; ``{question}``, ``{golden_answers}`` and ``{prediction}`` are filled in
DEFAULT_PROMPT = (
    "You are grading the answer to a question against its golden answers.\n"
    "Question: {question}\n"
    "Golden answers: {golden_answers}\n"
    "Predicted answer: {prediction}\n"
    "Does the predicted answer mean the same as one of the golden answers (other wording, "
    "a fuller or shorter name or date of the same thing counts as the same)? "
    "Reply with one word: yes or no."
)
PLACEHOLDERS = ("{question}", "{golden_answers}", "{prediction}")
#: a key benched by a 429 without ``Retry-After`` comes back after this long
_COOLDOWN_S = 60.0


@dataclass(frozen=True)
class JudgeSettings:
    """``[reward.judge]``: where the judge is and how it is asked (``docs/rewards.md``)."""

    #: the OpenAI-compatible server (TaoToken: https://taotoken.net/api; vLLM: http://host:8000)
    api_base: str = ""
    #: ``"${VAR}"``; several keys comma-separated are used in turn
    api_key: str = field(default="", metadata={"secret": True}, repr=False)
    #: the judge model's name on that server
    model: str = ""
    #: the judge's prompt; {question}, {golden_answers} and {prediction} are filled in
    prompt: str = DEFAULT_PROMPT
    #: the longest verdict the judge may write, in tokens
    max_tokens: int = field(default=16, metadata={"min": 1})
    #: the judge's sampling temperature (0: the same verdict for the same answer)
    temperature: float = field(default=0.0, metadata={"min": 0.0})
    #: merged into every request body (``chat_template_kwargs``, vLLM's ``structured_outputs``)
    extra_body: dict[str, Any] = field(default_factory=dict)
    #: judge calls in flight at once
    concurrency: int = field(default=8, metadata={"min": 1})
    #: seconds one judge call may take
    timeout_s: float = field(default=30.0, metadata={"gt": 0.0})
    #: retries of a call that failed with 408/429/5xx or on the network
    max_retries: int = field(default=3, metadata={"min": 0})
    #: a server asking (Retry-After) to wait longer than this fails the call at once
    max_retry_after_s: float = field(default=30.0, metadata={"min": 0.0})
    #: seconds all of a step's judge calls may take; the rest fall back
    step_deadline_s: float = field(default=300.0, metadata={"gt": 0.0})
    #: the score of a trajectory the judge gave no verdict for
    fallback: str = field(default="em", metadata={"choices": ("em", "f1", "zero")})
    #: price per million prompt tokens (0: no cost reported)
    price_in: float = field(default=0.0, metadata={"min": 0.0})
    #: price per million completion tokens (0: no cost reported)
    price_out: float = field(default=0.0, metadata={"min": 0.0})
    #: keep verdicts on disk for later runs
    disk_cache: bool = True


def settings_problems(s: JudgeSettings) -> list[str]:
    """What a judge cannot run with (the scheme of ``api_base`` and the numbers are checked
    with the rest of the config)."""
    out = []
    if not s.api_base.strip():
        out.append(
            "reward.judge.api_base is empty: the judge needs an OpenAI-compatible server "
            '(TaoToken: api_base = "https://taotoken.net/api", vLLM: "http://host:8000")'
        )
    if not s.model.strip():
        out.append(
            'reward.judge.model is empty: name the judge model on that server (e.g. "qwen3-8b")'
        )
    missing = [p for p in PLACEHOLDERS[1:] if p not in s.prompt]
    if missing:
        out.append(
            f"reward.judge.prompt lacks {' and '.join(missing)}: the judge must see the golden "
            f"answers and the prediction (placeholders {', '.join(PLACEHOLDERS)})"
        )
    if not isinstance(s.extra_body, Mapping):
        out.append("reward.judge.extra_body must be a table, e.g. {chat_template_kwargs = {...}}")
    return out


@dataclass(frozen=True)
class JudgeItem:
    question: str
    prediction: str
    golden_answers: tuple[str, ...]


@dataclass(frozen=True)
class Judged:
    """One item's outcome: ``score`` in [0, 1], or None with ``error`` (the caller falls back)."""

    score: float | None
    cached: bool = False
    error: str = ""


_THINK_RE = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_VERDICT_RE = re.compile(
    r"\b(yes|no|correct|incorrect|true|false)\b|(?<![\w.])(1(?:\.0+)?|0(?:\.\d+)?)(?![\w.])",
    re.IGNORECASE,
)
_WORDS = {"yes": 1.0, "correct": 1.0, "true": 1.0, "no": 0.0, "incorrect": 0.0, "false": 0.0}


def parse_verdict(text: str | None) -> float | None:
    """The first verdict in a reply: yes / correct / true (1.0), no / incorrect / false (0.0)
    or a number in [0, 1]; reasoning in ``<think>`` blocks is skipped. None: no verdict."""
    if not text:
        return None
    match = _VERDICT_RE.search(_THINK_RE.sub(" ", text))
    if match is None:
        return None
    word, number = match.groups()
    return _WORDS[word.lower()] if word else float(number)


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


@dataclass
class _Spend:
    calls: int = 0
    cache_hits: int = 0
    disk_hits: int = 0
    failures: int = 0
    unparsed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    last_error: str = ""

    def add(self, other: _Spend) -> None:
        for name, value in vars(other).items():
            if isinstance(value, int):
                setattr(self, name, getattr(self, name) + value)


class Judge:
    """See the module docstring. One per reward instance; not thread-safe (one event loop at a
    time)."""

    def __init__(self, settings: JudgeSettings, *, store_path: Path | None = None):
        self.settings = settings
        base = settings.api_base.strip().rstrip("/")
        self.url = (
            f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"
        )
        keys = [k.strip() for k in re.split(r"[,\n]", settings.api_key) if k.strip()]
        self.keys = KeyPool(keys, _COOLDOWN_S, provider="judge", events="judge")
        self.http = HttpClient(
            policy=RetryPolicy(
                max_retries=settings.max_retries,
                max_retry_after_s=settings.max_retry_after_s,
                attempt_timeout_s=settings.timeout_s,
            ),
            max_connections=settings.concurrency,
            timeout=settings.timeout_s,
            name=f"the judge's HTTP client ({safe_url(self.url)})",
        )
        self.channel = Channel(
            service="the reward judge",
            url=self.url,
            address="reward.judge.api_base",
            key="reward.judge.api_key" if keys else "",
            model=settings.model,
            model_setting="reward.judge.model",
            timeout_s=settings.timeout_s,
            timeout_setting="reward.judge.timeout_s",
            retries=f"up to {settings.max_retries} retries (reward.judge.max_retries)",
        )
        # what decides a verdict besides the item: the prompt and the request's extras
        version = json.dumps([settings.prompt, settings.extra_body], sort_keys=True, default=str)
        self.prompt_version = hashlib.sha256(version.encode()).hexdigest()[:12]
        self._step, self._run = _Spend(), _Spend()
        store = None
        if settings.disk_cache:
            from searchr1.kit.search.cache import answer_store_path

            store = _VerdictStore(store_path or answer_store_path())
        #: this run's verdicts, the disk store's, and the calls in flight
        self.memo: Memo[str, float] = Memo({}, store)

    # ------------------------------------------------------------------ scoring

    def key(self, item: JudgeItem) -> str:
        """The cache key of ``item``'s verdict (see the module docstring): a hash, no text."""
        parts = [
            self.settings.model,
            self.prompt_version,
            _fold(item.question),
            _fold(item.prediction),
            sorted(_fold(g) for g in item.golden_answers),
        ]
        return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()

    def prompt(self, item: JudgeItem) -> str:
        """The one user message the judge reads (``str.replace``, so braces elsewhere in a
        custom prompt stay as written)."""
        golden = "; ".join(item.golden_answers)
        text = self.settings.prompt.replace("{question}", item.question)
        return text.replace("{golden_answers}", golden).replace("{prediction}", item.prediction)

    async def judge_many(self, items: Sequence[JudgeItem]) -> list[Judged]:
        """One outcome per item, in order (see the module docstring); never raises."""
        spend = _Spend()
        out: list[Judged | None] = [None] * len(items)
        todo = self._recall(items, spend, out)
        unjudged = await self._ask_all(items, todo, spend, out) if todo else 0
        if spend.failures:
            get_logger().warning(
                "judge_failures",
                failed=spend.failures,
                calls=spend.calls,
                without_verdict=unjudged,
                url=safe_url(self.url),
                last_error=spend.last_error,
                fallback=self.settings.fallback,
            )
        self._step.add(spend)
        self._step.last_error = spend.last_error or self._step.last_error
        return [j if j is not None else Judged(None, error="not judged") for j in out]

    def _recall(
        self, items: Sequence[JudgeItem], spend: _Spend, out: list[Judged | None]
    ) -> dict[str, list[int]]:
        """Fill ``out`` with the verdicts remembered (this run's, then the disk store's);
        return the items left to ask, by key (the same answer twice in one batch is paid once)."""
        todo: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            key = self.key(item)
            if key in todo:
                todo[key].append(i)
                spend.cache_hits += 1
                continue
            score, from_disk = self.memo.recall(key)
            spend.disk_hits += from_disk
            if score is not None:
                out[i] = Judged(score, cached=True)
                spend.cache_hits += 1
            else:
                todo[key] = [i]
        return todo

    async def _ask_all(
        self,
        items: Sequence[JudgeItem],
        todo: dict[str, list[int]],
        spend: _Spend,
        out: list[Judged | None],
    ) -> int:
        """Ask the judge once per key of ``todo``, all at once within the step deadline, and
        fill ``out``; a verdict is remembered. Return how many items were left without one."""
        unjudged = 0
        spend.calls += len(todo)
        tasks = {
            key: asyncio.ensure_future(self._share(key, items[idx[0]], spend))
            for key, idx in todo.items()
        }
        done, pending = await asyncio.wait(tasks.values(), timeout=self.settings.step_deadline_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        deadline = (
            "no verdict within the step deadline "
            f"(step_deadline_s = {self.settings.step_deadline_s:g})"
        )
        for key, task in tasks.items():
            judged = task.result() if task in done else Judged(None, error=deadline)
            if judged.score is None:
                spend.failures += 1
                spend.last_error = judged.error
                unjudged += len(todo[key])
            for i in todo[key]:
                out[i] = judged
        return unjudged

    async def _share(self, key: str, item: JudgeItem, spend: _Spend) -> Judged:
        """:meth:`_ask` once for the concurrent calls of ``key``; a verdict is remembered."""
        judged, shared = await self.memo.share(
            key, lambda: self._ask(item, spend), keep=lambda j: j.score
        )
        if shared and judged.score is not None:  # another batch's call answered it: a hit
            spend.calls -= 1
            spend.cache_hits += 1
        return judged

    async def _ask(self, item: JudgeItem, spend: _Spend) -> Judged:
        """One chat call (retried by the HTTP client); never raises but for cancellation."""
        try:
            content = await self._reply(item, spend)
        except _NoKeyLeft:
            reasons = "; ".join(f"key {i}: {r}" for i, r in sorted(self.keys.bench_reasons.items()))
            return Judged(None, error=f"every judge key is benched ({reasons or 'no key left'})")
        except HttpError as exc:
            return Judged(None, error=redact_text(str(exc)))
        except _Malformed:
            return Judged(None, error=f"malformed response from {safe_url(self.url)}")
        score = parse_verdict(content)
        if score is None:
            spend.unparsed += 1
            return Judged(None, error=f"the judge's reply holds no verdict: {_shown(content)!r}")
        return Judged(score)

    async def _reply(self, item: JudgeItem, spend: _Spend) -> str | None:
        """The reply's text of one chat call (retried by the HTTP client); raises
        :class:`_NoKeyLeft`, :class:`HttpError` or :class:`_Malformed`."""
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [{"role": "user", "content": self.prompt(item)}],
            "max_tokens": self.settings.max_tokens,
            "temperature": self.settings.temperature,
            **self.settings.extra_body,
        }
        current: list[int] = [0]

        def build(client: httpx.AsyncClient) -> httpx.Request:
            slot = self.keys.acquire()
            if slot is None:
                raise _NoKeyLeft
            current[0], key = slot
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return client.build_request("POST", self.url, json=body, headers=headers)

        def decide(response: httpx.Response) -> Verdict:
            status = response.status_code
            if 200 <= status < 300:
                self.keys.succeeded(current[0])
                return Verdict.ACCEPT
            others = self.keys.others_available(current[0])
            if status == 429 and others:  # this key's quota: go on with the next one
                wait = parse_retry_after(response.headers.get("Retry-After"))
                self.keys.bench(current[0], "rate limited (429)", wait)
                return Verdict.AGAIN
            if status in (401, 403):
                self.keys.bench(
                    current[0], f"key rejected ({status})", float("inf"), rejected=status
                )
                return Verdict.AGAIN if others else Verdict.REJECT
            return Verdict.RETRY if is_retryable_status(status) else Verdict.REJECT

        response = await self.http.send(build, decide=decide)
        try:
            payload = response.json()
            message = payload["choices"][0]["message"]
            content = message.get("content")
            usage = payload.get("usage") or {}
            spend.tokens_in += int(usage.get("prompt_tokens") or 0)
            spend.tokens_out += int(usage.get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Malformed from None
        return content if isinstance(content, str) else None

    async def check(self, item: JudgeItem) -> float:
        """One call on ``item`` before any rollout, past the run's memory and the disk cache
        (a verdict kept from an earlier run says nothing of the judge now); its verdict is
        kept in neither. Returns the verdict, or raises the
        :class:`~searchr1.core.errors.RemoteError` of the failure's class: a rejected key,
        an unknown model, a reply that is not the API's or holds no verdict exit 2 (the
        config's to fix); the judge down past its retries, 429 or 5xx exit 3. The call counts
        in the run's spend (``judge/calls_total``), not in a step's."""
        spend = _Spend(calls=1)
        during = "its check before the rollout"
        try:
            content = await self._reply(item, spend)
        except _NoKeyLeft:
            reasons = " ".join(self.keys.bench_reasons.values())
            cls = RemoteAuthError if "rejected" in reasons else RemoteRateLimited
            raise self.channel.failed(cls, "every key is benched", during) from None
        except HttpError as exc:
            raise self.channel.error(exc, during) from None
        except _Malformed:
            raise self.channel.failed(RemoteMalformed, "no choices[0].message", during) from None
        finally:
            self._run.add(spend)
        score = parse_verdict(content)
        if score is None:
            self._run.unparsed += 1
            raise _no_verdict(self.channel, content, during)
        get_logger().info(
            "judge_checked", url=safe_url(self.url), model=self.settings.model, verdict=score
        )
        return score

    # ------------------------------------------------------------------ accounting

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """``judge/*`` of the step so far (calls, cache and disk hits, failures, replies with
        no verdict, tokens, ``cost`` with prices set) and their ``*_total`` over the run;
        ``reset`` starts the next step."""
        s = self.settings
        step, run = self._step, _Spend()
        run.add(self._run)
        run.add(step)
        out: dict[str, float] = {}
        for name in ("calls", "cache_hits", "disk_hits", "failures", "unparsed"):
            out[f"judge/{name}"] = float(getattr(step, name))
        for name in ("calls", "cache_hits", "tokens_in", "tokens_out"):
            out[f"judge/{name}_total"] = float(getattr(run, name))
        out["judge/tokens_in"], out["judge/tokens_out"] = (
            float(step.tokens_in),
            float(step.tokens_out),
        )
        if s.price_in or s.price_out:
            out["judge/cost"] = (step.tokens_in * s.price_in + step.tokens_out * s.price_out) / 1e6
            out["judge/cost_total"] = (
                run.tokens_in * s.price_in + run.tokens_out * s.price_out
            ) / 1e6
        if reset:
            self._run, self._step = run, _Spend()
        return out

    def problem(self) -> str | None:
        """Why this step's rewards must not train the model: the judge answered none of the
        step's calls (fallback scores only), or None."""
        step = self._step
        if step.calls == 0 or step.failures < step.calls:
            return None
        return (
            f"the reward judge at {safe_url(self.url)} gave no verdict on any of its "
            f"{step.calls} calls this step (last: {step.last_error})"
        )

    def decided_failure(self) -> RemoteError | None:
        """The failure no wait mends (:meth:`KeyPool.failure_for_run`): every key benched
        for the rest of the run, a rejected one making it exit 2. Else None."""
        return self.keys.failure_for_run(self.channel)

    async def aclose(self) -> None:
        await self.http.aclose()
        self.memo.close()


class _NoKeyLeft(Exception):
    """Every key is benched: end the call without another attempt."""


class _Malformed(Exception):
    """A 2xx whose body is not a chat completion."""


def _shown(content: str | None) -> str:
    """The start of a reply, for a message (secrets redacted)."""
    return redact_text(" ".join(str(content).split())[:80])


def _no_verdict(channel: Channel, content: str | None, during: str) -> RemoteError:
    """A reply in which :func:`parse_verdict` finds no verdict, as the config's problem."""
    return RemoteMalformed(
        f"{channel.service} at {channel.url} answered {during} without a verdict "
        f"(yes/no or a number in [0, 1]): {_shown(content)!r}. A model that reasons first "
        f"needs a larger reward.judge.max_tokens (or thinking off in reward.judge.extra_body, "
        f"e.g. chat_template_kwargs = {{enable_thinking = false}}); a custom reward.judge.prompt "
        f"must ask for yes or no",
        url=channel.url,
        service=channel.service,
    )


class _VerdictStore:
    """Verdicts on disk, keyed by :meth:`Judge.key` (a hash: no text, no key), kept until
    evicted, in the search answers' :class:`~searchr1.kit.search.cache.DiskStore` folder."""

    def __init__(self, path: Path):
        from searchr1.kit.search.cache import DiskStore

        self.path = path
        self._disk = DiskStore(path, "judge", "verdicts")

    def get(self, key: str) -> float | None:
        value = self._disk.get(f"verdict:{key}")
        try:
            return None if value is None else float(value)
        except ValueError:  # a value another version wrote: ask the judge
            return None

    def put(self, key: str, score: float) -> None:
        self._disk.put(f"verdict:{key}", repr(score))

    @property
    def active(self) -> bool:
        return self._disk.active

    def close(self) -> None:
        self._disk.close()
