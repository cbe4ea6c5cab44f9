"""Checks on config values that need no schema: secrets by value, and URLs.

:func:`searchr1.core.config.parse_config` calls :func:`secret_variable_values` on the raw
TOML (before ``${VAR}`` filling) to learn every value that must be masked, and
:func:`url_problems` on the filled tables; :meth:`searchr1.core.config.Config.to_dict` and the
error messages pass text through :func:`mask_secrets`. Redaction is by value: a key fed
through ``${VAR}`` is masked wherever it shows up again, e.g. inside a URL's query string
(``api_base = "https://h/v1?key=${TAOTOKEN_API_KEY}"``), not only in its own field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

REDACTED = "***"
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def mask_secrets(text: str, secrets: Collection[str]) -> str:
    """``text`` with every secret value in it replaced by ``***``: a whole value equal to a
    secret, and any secret of 4 characters or more inside it (a key in a URL's query string).
    Longest first, so a key that contains another is masked whole."""
    if text in secrets:
        return REDACTED
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4 and secret in text:
            text = text.replace(secret, REDACTED)
    return text


#: a plugin table's key that holds a secret (``api_key``, ``token``, ``client_secret``...);
#: ``max_tokens`` is not one, hence the exact forms rather than a substring match
_SECRET_KEY_RE = re.compile(
    r"^(?:.*_)?(?:api_?keys?|keys?|token|secret|password|passwd)$", re.IGNORECASE
)
#: keys whose value is a URL: checked for an http(s) scheme and a host
_URL_KEY_RE = re.compile(r"^(?:api_base|base_url|url|.*_url)$")


def secret_variable_values(
    value: Any, dotted: str, env: Mapping[str, str], secret_fields: frozenset[str]
) -> set[str]:
    """The resolved value of every ``${VAR}`` that feeds a secret field (``model.api_key``,
    ``search.api_keys``, a plugin table's ``api_key``/``token``/...), split at commas and
    newlines too, so that a key is masked wherever it shows up again (redaction by value)."""
    if isinstance(value, dict):
        found: set[str] = set()
        for k, v in value.items():
            found |= secret_variable_values(v, f"{dotted}.{k}" if dotted else k, env, secret_fields)
        return found
    if isinstance(value, list):
        return {s for v in value for s in secret_variable_values(v, dotted, env, secret_fields)}
    if not isinstance(value, str):
        return set()
    key = dotted.rsplit(".", 1)[-1]
    in_plugin_table = dotted.count(".") >= 2
    if dotted not in secret_fields and not (in_plugin_table and _SECRET_KEY_RE.match(key)):
        return set()
    found = set()
    for var in _VAR_RE.findall(value):
        got = env.get(var, "").strip()
        if got:
            found.add(got)
            found.update(p.strip() for p in re.split(r"[,\n]", got) if p.strip())
    return found


def url_problems(value: Any, where: Callable[[str], str], dotted: str = "") -> list[str]:
    """A URL field (``api_base``, ``*_url``) without an http(s) scheme or a host would
    otherwise fail at the first request as a vague "connection error", retried."""
    from urllib.parse import urlsplit

    if isinstance(value, dict):
        return [
            p
            for k, v in value.items()
            for p in url_problems(v, where, f"{dotted}.{k}" if dotted else k)
        ]
    key = dotted.rsplit(".", 1)[-1]
    if not isinstance(value, str) or not value.strip() or not _URL_KEY_RE.match(key):
        return []
    url = value.strip()
    parts = urlsplit(url)
    if "://" not in url:
        problem = f"has no scheme; write it as https://{url} (or http:// for a local server)"
    elif parts.scheme.lower() not in ("http", "https"):
        rest = url.split("://", 1)[1]
        problem = (
            f"has scheme {parts.scheme!r}; only http:// and https:// work "
            f"(did you mean https://{rest}?)"
        )
    elif not parts.hostname:
        problem = "has no host; write the whole address, e.g. https://taotoken.net/api"
    else:
        return []
    return [f"{where(dotted)}: {dotted} = {value!r} {problem}"]
