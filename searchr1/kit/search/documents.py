"""Turning corpus rows and retriever documents into :class:`SearchResult` s.

Used by the ``local`` provider (JSONL corpus rows, at index time and query time) and by the
``search_r1`` provider (documents returned by the Search-R1 retrieval server). Both speak
Search-R1's row layout, ``{"id": ..., "contents": "\\"Title\\"\\ntext"}``; the local corpus may
also use plain ``{"title": ..., "text": ...}`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchr1.sdk import SearchResult


class DocumentError(ValueError):
    """A row that is neither ``{"contents": ...}`` nor ``{"title", "text"}``; the message
    says what is missing (the caller adds the file and line)."""


def split_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``("Title", "text")``.

    The first line is the title, usually in double quotes; a ``contents`` without a newline
    is all text (no title)."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    title = head.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title.strip(), rest.strip()


def row_title_text(row: Any) -> tuple[str, str]:
    """The (title, text) of one corpus row or retriever document; DocumentError otherwise."""
    if not isinstance(row, Mapping):
        raise DocumentError(f"expected a JSON object, got {type(row).__name__}")
    contents = row.get("contents")
    if isinstance(contents, str):
        return split_contents(contents)
    title, text = row.get("title"), row.get("text")
    if isinstance(text, str):
        return (title if isinstance(title, str) else "").strip(), text.strip()
    raise DocumentError(
        'expected a "contents" string (Search-R1 layout) or "title"/"text" strings, '
        f"got keys {sorted(map(str, row))[:6]}"
    )


def row_to_result(row: Any, score: float = 0.0) -> SearchResult:
    """A SearchResult from one row (``url`` from a ``url`` field when present)."""
    title, text = row_title_text(row)
    url = row.get("url", "") if isinstance(row, Mapping) else ""
    return SearchResult(
        title=title, text=text, url=url if isinstance(url, str) else "", score=score
    )
