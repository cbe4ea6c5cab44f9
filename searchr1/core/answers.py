"""Answer extraction, normalisation, exact match and F1 (``docs/protocols.md`` §4). Pure functions
over strings (no tokenizer, no torch, no knowledge of protocols), used by rewards, eval and the
protocols, which read their own answer format with :func:`answer_elements` (``<answer>``
elements) or :func:`answer_lines` (``Answer:`` lines).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

from searchr1.core.old_imports import warn_plugins

_ANSWER_ELEMENT_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ANSWER_LINE_RE = re.compile(r"^[ \t]*Answer:[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def answer_elements(text: str) -> list[str]:
    """The stripped contents of every complete ``<answer>...</answer>`` element."""
    return [m.strip() for m in _ANSWER_ELEMENT_RE.findall(text)]


def answer_lines(text: str) -> list[str]:
    """The stripped value of every line of the form ``Answer: <value>`` (value may be empty)."""
    return [m.group(1).strip() for m in ANSWER_LINE_RE.finditer(text)]


def normalize_answer(text: str) -> str:
    """Search-R1's (SQuAD's) normalisation, extended to Unicode.

    On ASCII, exactly Search-R1's ``normalize_answer`` (``tests/rollout/test_rewards.py`` checks it
    against a reimplementation): lower-case, remove all of ``string.punctuation`` (so
    ``"$100"`` matches ``"100"``, ``"C++"`` matches ``"C"``), a/an/the become a space,
    collapse whitespace. Beyond ASCII: NFKC first (``"１００"`` is ``"100"``), and Unicode
    punctuation (category P: ``，。「」—``) is removed too; symbols (``€ ° ×``) are kept."""
    text = unicodedata.normalize("NFKC", text).lower()
    # Removed, not spaced: "Saint-Exupéry" -> "saintexupéry", so EM stays comparable.
    text = "".join(
        ch
        for ch in text
        if ch not in _ASCII_PUNCTUATION and not unicodedata.category(ch).startswith("P")
    )
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golden_answers: Iterable[str]) -> bool:
    """The normalised prediction equals a normalised golden answer; empty never matches."""
    if prediction is None:
        return False
    pred = normalize_answer(prediction)
    return bool(pred) and any(pred == normalize_answer(g) for g in golden_answers)


#: answers HotpotQA's official scorer gives F1 only when prediction and golden are equal
_YES_NO = frozenset({"yes", "no", "noanswer"})


def f1_score(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """Best token-level F1 (over normalised whitespace tokens) against any golden answer, as
    HotpotQA's official scorer computes it: a yes / no / noanswer prediction or golden answer
    scores only when both are equal (``"yes"`` is no partial match of ``"yes it is"``)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    pred_tokens = pred.split()
    best = 0.0
    for golden in golden_answers:
        gold = normalize_answer(golden)
        if (pred in _YES_NO or gold in _YES_NO) and pred != gold:
            continue
        gold_tokens = gold.split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
