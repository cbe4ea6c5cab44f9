"""One QA row (a JSON object or a parquet record), in any accepted layout, read into a
:class:`~searchr1.core.types.Question` (or a :class:`RowError` with a reason a person can act
on); :mod:`searchr1.plugins.qa_files.readers` calls it once per row. Layouts:

- Search-R1 flat: ``{"id", "question", "golden_answers": [...], "data_source"}``;
- Search-R1 nested (the verl parquet files the original trains on):
  ``{"data_source", "prompt": [{"role": "user", "content": "...Question: q\\n"}],
  "reward_model": {"ground_truth": {"target": [...]}}, "extra_info": {"index": 3}}``
  (the flat columns win when both are present, as in the published files);
- plain: ``{"question", "answers": [...]}`` (or ``"answer": "..."``).

Ids are stable: a row without one gets a hash of its question and answers, and ids are
prefixed by ``data_source`` (published test files reuse ``test_0`` across sources).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from searchr1.core.types import Question

#: keys that may carry the golden answers, in order of preference
_ANSWER_KEYS = ("golden_answers", "answers", "answer", "golden_answer", "target")
#: every column :func:`question_from_row` may read (a parquet file is read for these only)
COLUMNS = frozenset(
    {"id", "question", "data_source", "prompt", "reward_model", "extra_info", *_ANSWER_KEYS}
)


class RowError(ValueError):
    """A row that cannot become a question; the message says why."""


def question_from_row(row: Any, number: int) -> Question:
    """The question in ``row`` (row ``number``, 1-based, is kept in its metadata)."""
    if not isinstance(row, Mapping):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    text = _question_text(row)
    answers = _golden_answers(row)
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise RowError(f"'data_source' must be a string, got {type(source).__name__}")
    source = (source or "").strip()
    row_id = row.get("id")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    if row_id is None and extra.get("index") is not None:
        row_id = extra["index"]
    if row_id is not None and not isinstance(row_id, str | int):
        raise RowError(f"'id' must be a string or integer, got {type(row_id).__name__}")
    if row_id is None or str(row_id).strip() == "":
        digest = hashlib.sha1(json.dumps([text, answers]).encode()).hexdigest()[:12]
        qid = f"q-{digest}"
    else:
        qid = str(row_id).strip()
    if source and not qid.startswith(f"{source}/"):
        qid = f"{source}/{qid}"
    metadata: dict[str, Any] = {"row": number}
    if extra:
        metadata["extra_info"] = dict(extra)
    return Question(
        id=qid,
        question=text,
        golden_answers=tuple(answers),
        data_source=source,
        metadata=metadata,
    )


def _question_text(row: Mapping[str, Any]) -> str:
    text = row.get("question")
    if text is None:
        text = _question_from_prompt(row.get("prompt"))
        if text is None:
            raise RowError("missing 'question' (and no user message in 'prompt')")
    if not isinstance(text, str):
        raise RowError(f"'question' must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise RowError("empty 'question'")
    return text


def _question_from_prompt(prompt: Any) -> str | None:
    """The question inside the original's chat prompt: the last user message, after its
    final ``Question:`` marker (the original prepends instructions to every question)."""
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, Sequence):
        users = [
            m.get("content")
            for m in prompt
            if isinstance(m, Mapping)
            and m.get("role") == "user"
            and isinstance(m.get("content"), str)
        ]
        if not users:
            return None
        content = users[-1]
    else:
        return None
    head, marker, tail = content.rpartition("Question:")
    return (tail if marker else content).strip()


def _golden_answers(row: Mapping[str, Any]) -> list[str]:
    raw: Any = None
    for key in _ANSWER_KEYS:
        if row.get(key) is not None:
            raw = row[key]
            break
    if raw is None:
        reward_model = row.get("reward_model")
        if isinstance(reward_model, Mapping):
            truth = reward_model.get("ground_truth")
            raw = truth.get("target") if isinstance(truth, Mapping) else truth
    if raw is None:
        raise RowError(
            "no golden answers (expected 'golden_answers', 'answers' or "
            "'reward_model.ground_truth.target')"
        )
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        raw = [raw]
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise RowError(f"golden answers must be a list of strings, got {type(raw).__name__}")
    answers: list[str] = []
    for item in raw:
        # Numbers appear in some sets (years, counts); an answer is compared as text anyway.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise RowError(f"golden answer {item!r} is not a string")
        value = str(item).strip()
        if value and value not in answers:
            answers.append(value)
    if not answers:
        raise RowError("golden answers are empty")
    return answers
