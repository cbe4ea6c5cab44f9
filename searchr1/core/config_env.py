"""Where config values come from besides the file: ``.env`` files and ``${VAR}`` placeholders.

:func:`searchr1.core.config.load_config` calls :func:`load_dotenv_files` before parsing
(``.env`` next to the config file, then in the working directory; a variable already set in
the environment wins, unless it is exported but empty). :func:`searchr1.core.config.parse_config`
calls :func:`interpolate` on the raw TOML: every ``${VAR}`` is filled from the environment, a
missing or empty variable is a problem naming the field and the variable, and a value filled
from a variable whose name says it holds a secret (``*_KEY(S)``, ``*_TOKEN``, ``SECRET``...)
is recorded for redaction, as is every value of a field the schema marks ``secret``
(:data:`SECRET_FIELDS`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from searchr1.core.config_schema import SECTIONS
from searchr1.core.errors import ConfigError

_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: a variable name that holds a secret: a KEY(S)/TOKEN/PASSWORD part (``HF_TOKEN``,
#: ``ZHIHU_SEARCH_KEYS``, ``APIKEY``) or SECRET/PASSWORD anywhere; ``MAX_TOKENS`` is not one,
#: which is why name parts are matched rather than substrings (a masked "2048" would blank
#: every number 2048 in the logs)
_SECRET_VAR_RE = re.compile(
    r"(?:^|_)(?:API_?)?(?:KEYS?|TOKEN|PASS|PASSWD)(?:_|$)|SECRET|PASSWORD", re.IGNORECASE
)


#: config fields whose value is a secret (their metadata says ``secret``)
SECRET_FIELDS = frozenset(
    f"{section}.{f.name}"
    for section, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
    if f.metadata.get("secret")
)


def interpolate(
    value: Any,
    dotted: str,
    env: Mapping[str, str],
    problems: list[str],
    where: Any,
    secrets: set[str],
    variables: dict[str, str],
) -> Any:
    """``value`` with every ``${VAR}`` filled from ``env``; records secrets and, in
    ``variables``, which variable filled each dotted field."""
    if isinstance(value, dict):
        return {
            k: interpolate(
                v, f"{dotted}.{k}" if dotted else k, env, problems, where, secrets, variables
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [interpolate(v, dotted, env, problems, where, secrets, variables) for v in value]
    if not isinstance(value, str):
        return value

    def fill(match: re.Match[str]) -> str:
        var = match.group(1)
        variables.setdefault(dotted, var)
        got = env.get(var, "")
        if not got.strip():
            if var not in env:
                state, fix = "is not set", "set it in the environment or in a .env file"
            else:
                state = "is exported but empty"
                fix = f"export a value, or `unset {var}` and put {var}=... in a .env file"
            problems.append(
                f"{where(dotted)}: {dotted} needs environment variable {var}, which {state}; "
                f"{fix} next to the config"
            )
            return ""
        if _SECRET_VAR_RE.search(var):
            secrets.add(got)
            secrets.update(p.strip() for p in re.split(r"[,\n]", got) if p.strip())
        return got

    return _VAR_RE.sub(fill, value)


def load_dotenv_files(config_dir: Path) -> list[str]:
    """Load ``.env`` files into ``os.environ`` (a variable set in the environment wins) and
    return warnings. A variable exported but **empty** does not win: it is filled from ``.env``
    when a file gives it a value, and the warning says so (an empty export is almost always a
    leftover ``export VAR=``, and silently shadowing the file's key is what users trip on)."""
    from dotenv import dotenv_values, load_dotenv

    warnings: list[str] = []
    for folder in dict.fromkeys([config_dir, Path.cwd()]):
        env_file = folder / ".env"
        if env_file.is_file():
            try:
                for name, value in dotenv_values(env_file).items():
                    if value and os.environ.get(name) == "":
                        os.environ[name] = value
                        warnings.append(
                            f"{name} is exported but empty in the environment; using its value "
                            f"from {env_file} (run `unset {name}` to silence this)"
                        )
                load_dotenv(env_file, override=False)
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    [
                        f"{env_file}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it "
                        f"as UTF-8"
                    ]
                ) from None
    return warnings
