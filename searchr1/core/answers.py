"""Answer extraction, normalisation, exact match and F1 (``docs/protocols.md`` §4).

Called by the reward plugins (the built-in ``rewards`` ones) once per finished trajectory,
by eval for its metrics, and by the agent protocols, which own their answer format and read
it with :func:`answer_elements` (``tags``) or :func:`answer_lines` (``tool_calls``); a reward
finds a trajectory's answers through its protocol
(:func:`searchr1.core.agent_protocol.extract_answers`). Pure functions over strings: no
tokenizer, no torch, and no knowledge of which protocol is which.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

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

    On ASCII text the result is exactly Search-R1's ``normalize_answer``: lower-case, remove
    every character of ``string.punctuation`` (symbols such as ``$ + < = > ^ ` | ~`` too, so
    ``"$100"`` matches ``"100"`` and ``"C++"`` matches ``"C"``), replace the words a/an/the by a
    space, collapse whitespace. ``tests/test_rewards.py`` checks this against a reimplementation
    of the original over generated strings.

    The Unicode extension (no effect on ASCII): NFKC first, so full-width letters, digits and
    symbols compare equal to their ASCII forms (``"１００"`` is ``"100"``, ``"＄"`` is ``"$"``);
    and every Unicode punctuation character (category P: ``，。「」—``...) is removed like
    ASCII punctuation. Non-ASCII symbols (category S: ``€ ° ×``) are kept, as in
    Search-R1."""
    text = unicodedata.normalize("NFKC", text).lower()
    # Removed, not replaced by a space: "Saint-Exupéry" -> "saintexupéry", as in SQuAD and
    # Search-R1, so EM numbers stay comparable with theirs.
    text = "".join(
        ch
        for ch in text
        if ch not in _ASCII_PUNCTUATION and not unicodedata.category(ch).startswith("P")
    )
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golden_answers: Iterable[str]) -> bool:
    """True when the normalised prediction equals any normalised golden answer. An empty
    prediction never matches (not even an empty golden answer)."""
    if prediction is None:
        return False
    pred = normalize_answer(prediction)
    return bool(pred) and any(pred == normalize_answer(g) for g in golden_answers)


def f1_score(prediction: str | None, golden_answers: Iterable[str]) -> float:
    """Best token-level F1 (over normalised whitespace tokens) against any golden answer."""
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for golden in golden_answers:
        gold_tokens = normalize_answer(golden).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
