"""Deterministic question order for training, and the cursor a checkpoint keeps: seeded
with ``run.seed``, several ``data_source`` values drawn in turn; ``state()`` goes into every
checkpoint and ``load_state`` puts the cursor back, so a resumed run sees exactly the
questions an uninterrupted one would (a changed data file or seed is refused, not silently
repeated or skipped).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from searchr1.core.types import Question
from searchr1.rl.rollout import RolloutConfigError, prompt_overflow

if TYPE_CHECKING:
    from searchr1.rl.job import Environment, Job


@dataclass
class _Lane:
    """Some of the questions (their indices), shuffled epoch after epoch: epoch ``e`` is the
    permutation from ``random.Random(f"{key}/{e}")`` (stable across Python versions)."""

    indices: tuple[int, ...]
    key: str
    #: the ``data_source`` it holds ("" for the one lane of unbalanced draws)
    source: str = ""
    epoch: int = 0
    cursor: int = 0
    order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.seek(self.epoch, self.cursor)

    def seek(self, epoch: int, cursor: int) -> None:
        if epoch < 0 or not 0 <= cursor <= len(self.indices):
            raise ValueError(f"invalid data cursor: epoch={epoch}, cursor={cursor}")
        self.epoch, self.cursor = epoch, cursor
        self.order = list(self.indices)
        random.Random(f"{self.key}/{epoch}").shuffle(self.order)

    def take(self, n: int) -> list[int]:
        """The next ``n`` indices; a take crossing an epoch's end continues into the next."""
        out: list[int] = []
        while len(out) < n:
            if self.cursor >= len(self.order):
                self.seek(self.epoch + 1, 0)
            k = min(n - len(out), len(self.order) - self.cursor)
            out += self.order[self.cursor : self.cursor + k]
            self.cursor += k
        return out


@dataclass
class QuestionStream:
    """Questions shuffled by ``seed`` alone, epoch after epoch.

    One ``data_source``: epoch ``e`` is the permutation from ``random.Random(f"{seed}/{e}")``.
    Several: each source is shuffled on its own (``f"{seed}/{source}/{e}"``) and the stream
    takes them in turn (sources in name order), so every batch of ``n`` questions holds
    ``n // S`` or ``n // S + 1`` of each of the ``S`` sources, whatever their sizes: a step
    (and a cold-start step) always sees every kind of question (one-hop and two-hop, NQ and
    HotpotQA) instead of whatever a shuffle happened to bunch together.
    """

    questions: Sequence[Question] = field(repr=False)
    seed: int = 0
    _lanes: list[_Lane] = field(default_factory=list, repr=False)
    #: questions drawn so far: the next one comes from lane ``drawn % len(lanes)``
    drawn: int = 0

    def __post_init__(self) -> None:
        self.questions = tuple(self.questions)
        if not self.questions:
            raise ValueError("QuestionStream needs at least one question")
        self._lanes = self._make_lanes(balanced=True)

    def _make_lanes(self, *, balanced: bool) -> list[_Lane]:
        by_source: dict[str, list[int]] = {}
        for i, q in enumerate(self.questions):
            by_source.setdefault(q.data_source, []).append(i)
        if not balanced or len(by_source) == 1:
            return [_Lane(tuple(range(len(self.questions))), str(self.seed))]
        return [
            _Lane(tuple(by_source[name]), f"{self.seed}/{name}", name) for name in sorted(by_source)
        ]

    @property
    def balanced(self) -> bool:
        """Whether sources are drawn in turn (the data has several)."""
        return len(self._lanes) > 1

    def next_batch(self, n: int) -> list[Question]:
        """The next ``n`` questions (called once per training step)."""
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        lanes = len(self._lanes)
        wanted = [0] * lanes
        for k in range(self.drawn, self.drawn + n):
            wanted[k % lanes] += 1
        taken = [lane.take(w) for lane, w in zip(self._lanes, wanted, strict=True)]
        batch = [self.questions[taken[k % lanes].pop(0)] for k in range(self.drawn, self.drawn + n)]
        self.drawn += n
        return batch

    def fingerprint(self) -> str:
        """A short hash of the question ids in file order: detects a changed data file."""
        h = hashlib.sha1()
        for q in self.questions:
            h.update(q.id.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]

    def state(self) -> dict[str, Any]:
        """What a checkpoint records (JSON-able)."""
        state: dict[str, Any] = {
            "seed": self.seed,
            "num_questions": len(self.questions),
            "fingerprint": self.fingerprint(),
        }
        if self.balanced:
            state["drawn"] = self.drawn
            state["sources"] = {lane.source: [lane.epoch, lane.cursor] for lane in self._lanes}
        else:
            state["epoch"], state["cursor"] = self._lanes[0].epoch, self._lanes[0].cursor
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a cursor saved by :meth:`state`; one recorded for another data file or
        seed raises ``ValueError``. A cursor saved before sources were drawn in turn
        continues that run's single shuffle, so it sees what it would have seen."""
        mismatches = [
            f"{key} was {state.get(key)!r}, now {now!r}"
            for key, now in (
                ("seed", self.seed),
                ("num_questions", len(self.questions)),
                ("fingerprint", self.fingerprint()),
            )
            if key in state and state[key] != now
        ]
        if mismatches:
            raise ValueError(
                "the checkpoint's data cursor does not match this data: "
                + "; ".join(mismatches)
                + " (same data file and run.seed needed to resume)"
            )
        if "sources" in state:
            self._lanes = self._make_lanes(balanced=True)
            saved = state["sources"]
            names = [lane.source for lane in self._lanes]
            if not self.balanced or sorted(saved) != names:
                raise ValueError(
                    f"the checkpoint's data cursor is for the sources {sorted(saved)}, "
                    f"this data has {names}"
                )
            for lane, name in zip(self._lanes, names, strict=True):
                epoch, cursor = saved[name]
                lane.seek(int(epoch), int(cursor))
            self.drawn = int(state["drawn"])
        else:
            self._lanes = self._make_lanes(balanced=False)
            self._lanes[0].seek(int(state["epoch"]), int(state["cursor"]))
            self.drawn = 0


def cursor_problem(state: Any) -> str | None:
    """Why ``state`` is not a data cursor :meth:`QuestionStream.state` wrote, or None."""
    if not isinstance(state, dict):
        return "'data' is not a saved data cursor"
    if "sources" in state:
        sources = state["sources"]
        if not isinstance(state.get("drawn"), int) or not (
            isinstance(sources, dict)
            and all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)
                for v in sources.values()
            )
        ):
            return "'data' is not a saved data cursor (drawn, per-source epoch and cursor)"
        return None
    if not all(isinstance(state.get(k), int) for k in ("epoch", "cursor")):
        return "'data' is not a saved data cursor (epoch, cursor)"
    return None


def draw_fitting(
    env: Environment, job: Job, stream: QuestionStream, n: int, field: str = "data.train"
) -> list[Question]:
    """The next ``n`` questions of ``stream`` (read from ``field``) that leave room for an
    answer. A question whose prompt alone fills ``rollout.max_trajectory_tokens`` can never
    be rolled out: it is skipped with a warning each time it is drawn, rather than ending a
    run hours in (a large QA set has a few such rows; tokenizing all of it up front would
    cost minutes)."""
    limit = env.config.rollout.max_trajectory_tokens
    batch: list[Question] = []
    skipped = 0
    while len(batch) < n:
        for question in stream.next_batch(n - len(batch)):
            overflow = prompt_overflow(env.protocol, question, limit)
            if overflow is None:
                batch.append(question)
                continue
            skipped += 1
            if skipped > len(stream.questions):
                raise RolloutConfigError(
                    f"{field}: no question leaves room in rollout.max_trajectory_tokens = "
                    f"{limit} ({overflow}); raise it"
                )
            if job.world.main:
                job.warn("question_skipped", f"{field}: {overflow}: it is skipped")
    return batch
