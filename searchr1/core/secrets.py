"""Secrets: which names hold one, and masking their values wherever they reappear (log
events, config dumps, error messages, HTTP errors).

A name is secret when its last part is a credential word (``api_key``, ``SEARCH_KEYS``,
``HF_TOKEN``, ``accessToken``, ``Authorization``, ``X-Api-Key``, ``Cookie``) or it holds SECRET/PASSWORD
anywhere. Parts, not substrings: ``MAX_TOKENS`` or ``key_cooldown_seconds`` is no secret
(masking "2048" would blank every 2048 logged). Values are masked by value: the
:class:`Secrets` of the command (its config's secrets, the keys its plugins register), plus
anything shaped like a bearer token.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Any

from searchr1.core.old_imports import warn_plugins

REDACTED = "***"
SECRET_NAME_RE = re.compile(
    r"(?:^|[_\-.]|(?-i:(?<=[a-z])(?=[A-Z])))(?:api_?)?(?:keys?|token|pass|passwd|auth|authorization|signature|cookie)"
    r"(?:[_\-]?(?:id|\d+))?$|secret|password",
    re.IGNORECASE,
)
_BEARER_RE = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-~+/=]{6,}", re.IGNORECASE)
#: shorter values are not masked inside text: a short flag would blank half a message
_MIN_LEN = 4


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


class Secrets:
    """The values one command masks wherever they appear: its config's secrets and the keys
    its plugins register (a search provider's key pool). Values under 4 characters are not
    kept: masking them inside text would blank half a message."""

    def __init__(self, values: Iterable[str] = ()):
        self._values: set[str] = set()
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        """Mask ``values`` too, from now on."""
        self._values.update(v for v in values if v and len(v) >= _MIN_LEN)

    def extended(self, values: Iterable[str]) -> Secrets:
        """A new :class:`Secrets` holding these values and ``values``."""
        grown = Secrets(self._values)
        grown.add(values)
        return grown

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def redact_text(self, text: str, secrets: Collection[str] = ()) -> str:
        """``text`` with ``secrets``, these values and bearer tokens replaced by ``***``: a
        whole equal value, and any secret of 4+ characters inside it (a key in a URL).
        Longest first, so a key containing another is masked whole."""
        if text in secrets:
            return REDACTED
        for secret in sorted({*secrets, *self._values}, key=len, reverse=True):
            if len(secret) >= _MIN_LEN and secret in text:
                text = text.replace(secret, REDACTED)
        return _BEARER_RE.sub(rf"\1{REDACTED}", text)

    def redact_value(
        self, value: Any, secrets: Collection[str] = (), *, by_name: bool = False
    ) -> Any:
        """``value`` with secrets masked recursively (see :meth:`redact_text`), an exception
        as its redacted one-line text; ``by_name``: also the whole value of a secret-named
        key."""
        if isinstance(value, str):
            return self.redact_text(value, secrets)
        if isinstance(value, dict):
            return {
                k: masked(v)
                if by_name and v and is_secret_name(str(k))
                else self.redact_value(v, secrets, by_name=by_name)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.redact_value(v, secrets, by_name=by_name) for v in value)
        if isinstance(value, BaseException):
            return self.redact_text(f"{type(value).__name__}: {value}", secrets)
        return value


#: The command's secrets, that the module functions below use: its RunLog's, bound with it
#: (:meth:`searchr1.core.logs.RunLog.bind`). The process's one binding point for redaction:
#: an HTTP error, a plugin's message or the CLI's error line is redacted where it is made,
#: by code no run is handed to.
_bound = Secrets()


def bind_secrets(secrets: Secrets) -> None:
    """Make ``secrets`` the ones :func:`redact_text` and :func:`register_secrets` use."""
    global _bound
    _bound = secrets


def bound_secrets() -> Secrets:
    """The secrets of the command this process runs now (:func:`bind_secrets`)."""
    return _bound


def register_secrets(values: Iterable[str]) -> None:
    """Add values that must never appear in any log line or error of the command (the keys
    a provider reads) to its :class:`Secrets`."""
    _bound.add(values)


def redact_text(text: str, secrets: Collection[str] = ()) -> str:
    """``text`` redacted of ``secrets`` and the command's (:meth:`Secrets.redact_text`)."""
    return _bound.redact_text(text, secrets)


def redact_value(value: Any, secrets: Collection[str] = (), *, by_name: bool = False) -> Any:
    """``value`` redacted of ``secrets`` and the command's (:meth:`Secrets.redact_value`)."""
    return _bound.redact_value(value, secrets, by_name=by_name)


def masked(value: Any) -> Any:
    """A secret's value as shown: ``***`` (one per item of a list)."""
    if isinstance(value, list | tuple):
        return [REDACTED] * len(value)
    return REDACTED if isinstance(value, str) else value


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
