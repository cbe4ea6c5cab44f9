"""Secrets: which names hold one, and masking their values wherever they reappear (log
events, config dumps, error messages, HTTP errors).

A name is secret when its last part is a credential word (``api_key``, ``SEARCH_KEYS``,
``HF_TOKEN``, ``accessToken``, ``Authorization``, ``X-Api-Key``, ``Cookie``) or it holds SECRET/PASSWORD
anywhere. Parts, not substrings: ``MAX_TOKENS`` or ``key_cooldown_seconds`` is no secret
(masking "2048" would blank every 2048 logged). Values are masked by value: every value
registered here (the config's secrets, the search keys), plus anything shaped like a bearer
token."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Any

REDACTED = "***"
SECRET_NAME_RE = re.compile(
    r"(?:^|[_\-.]|(?-i:(?<=[a-z])(?=[A-Z])))(?:api_?)?(?:keys?|token|pass|passwd|auth|authorization|signature|cookie)"
    r"(?:[_\-]?(?:id|\d+))?$|secret|password",
    re.IGNORECASE,
)
_BEARER_RE = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-~+/=]{6,}", re.IGNORECASE)
#: shorter values are not masked inside text: a short flag would blank half a message
_MIN_LEN = 4
_registered: set[str] = set()


def is_secret_name(name: str) -> bool:
    """Whether a config key, variable, header or query parameter named ``name`` holds a secret."""
    return bool(SECRET_NAME_RE.search(name))


def secret_parts(value: Any) -> set[str]:
    """A secret value and, for a list or a comma/newline separated string, each part."""
    out: set[str] = set()
    for item in value if isinstance(value, list | tuple) else [value]:
        if isinstance(item, str) and item.strip():
            out.add(item)
            out.update(p.strip() for p in re.split(r"[,\n]", item) if p.strip())
    return out


def register_secrets(values: Iterable[str]) -> None:
    """Add values that must never appear in any log line or error (e.g. keys a provider reads)."""
    _registered.update(v for v in values if v and len(v) >= _MIN_LEN)


def redact_text(text: str, secrets: Collection[str] = ()) -> str:
    """``text`` with ``secrets``, every registered secret and bearer tokens replaced by
    ``***``: a whole equal value, and any secret of 4+ characters inside it (a key in a URL).
    Longest first, so a key containing another is masked whole."""
    if text in secrets:
        return REDACTED
    for secret in sorted({*secrets, *_registered}, key=len, reverse=True):
        if len(secret) >= _MIN_LEN and secret in text:
            text = text.replace(secret, REDACTED)
    return _BEARER_RE.sub(rf"\1{REDACTED}", text)


def redact_value(value: Any, secrets: Collection[str] = (), *, by_name: bool = False) -> Any:
    """``value`` with secrets masked recursively (see :func:`redact_text`), an exception as
    its redacted one-line text; ``by_name``: also the whole value of a secret-named key."""
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {
            k: masked(v)
            if by_name and v and is_secret_name(str(k))
            else redact_value(v, secrets, by_name=by_name)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v, secrets, by_name=by_name) for v in value)
    if isinstance(value, BaseException):
        return redact_text(f"{type(value).__name__}: {value}", secrets)
    return value


def masked(value: Any) -> Any:
    """A secret's value as shown: ``***`` (one per item of a list)."""
    if isinstance(value, list | tuple):
        return [REDACTED] * len(value)
    return REDACTED if isinstance(value, str) else value
