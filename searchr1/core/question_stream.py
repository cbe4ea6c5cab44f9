"""Deterministic question order for training, and the cursor a checkpoint keeps: seeded
with ``run.seed``; ``state()`` goes into every checkpoint and ``load_state`` puts the
cursor back, so a resumed run sees exactly the questions an uninterrupted one would (a
changed data file or seed is refused, not silently repeated or skipped).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.core.types import Question


@dataclass
class QuestionStream:
    """Questions shuffled by ``seed`` alone, epoch after epoch: epoch ``e`` is the permutation
    from ``random.Random(f"{seed}/{e}")`` (stable across Python versions); a batch crossing
    an epoch's end continues into the next."""

    questions: Sequence[Question] = field(repr=False)
    seed: int = 0
    epoch: int = 0
    cursor: int = 0
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.questions = tuple(self.questions)
        if not self.questions:
            raise ValueError("QuestionStream needs at least one question")
        self._order = self._permutation(self.epoch)

    def __len__(self) -> int:
        return len(self.questions)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.questions)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Question]:
        """The next ``n`` questions (called once per training step)."""
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        batch: list[Question] = []
        while len(batch) < n:
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(batch), len(self._order) - self.cursor)
            batch += [self.questions[i] for i in self._order[self.cursor : self.cursor + take]]
            self.cursor += take
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
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_questions": len(self.questions),
            "fingerprint": self.fingerprint(),
        }

    def load_state(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Restore a cursor saved by :meth:`state`; with ``strict``, one recorded for another
        data file or seed raises ``ValueError``."""
        if strict:
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
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= len(self.questions):
            raise ValueError(f"invalid data cursor: epoch={epoch}, cursor={cursor}")
        self.epoch, self.cursor = epoch, cursor
        self._order = self._permutation(epoch)
