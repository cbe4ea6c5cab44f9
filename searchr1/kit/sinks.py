"""Helpers metric sink plugins share."""

from __future__ import annotations

from searchr1.sdk import UserError


def missing_package(sink: str, package: str, install: str) -> UserError:
    """A sink's package is missing; ``install`` is the pip argument (e.g. ``"searchr1[extra]"``)."""
    return UserError(
        f"log.sinks lists {sink!r}, which needs the {package!r} package, not installed here: "
        f"pip install '{install}' (or remove {sink!r} from [log] sinks)"
    )
