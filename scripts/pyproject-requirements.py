"""Print searchr1's requirements, one per line, read from pyproject.toml.

Used by scripts/make-wheelhouse.sh (what to download) and by the Dockerfile (what to install
in the dependency layer, before the source is copied), so neither keeps a hand-made list.
Includes ``[build-system].requires``, since the image builds the package offline with
``--no-build-isolation``.

    python3 scripts/pyproject-requirements.py PYPROJECT [EXTRAS] [--without NAME ...] [--extras-only]

EXTRAS is a comma-separated list of optional-dependency groups (e.g. ``remote``); each
``--without NAME`` drops that distribution (e.g. torch, when the base image provides it);
``--extras-only`` prints the groups' requirements alone (the Dockerfile's GPU kernel step).
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(
    pyproject_path: str, extras: str = "", without: tuple[str, ...] = (), extras_only: bool = False
) -> list[str]:
    with open(pyproject_path, "rb") as fh:
        pyproject = tomllib.load(fh)
    project = pyproject["project"]
    reqs: list[str] = []
    if not extras_only:
        reqs += pyproject.get("build-system", {}).get("requires", [])
        reqs += project.get("dependencies", [])
    optional = project.get("optional-dependencies", {})
    for extra in filter(None, (e.strip() for e in extras.split(","))):
        if extra not in optional:
            raise SystemExit(
                f"{pyproject_path}: no optional dependency group {extra!r}; known: {sorted(optional)}"
            )
        reqs += optional[extra]
    dropped = {_canonical(n) for n in without}
    return [
        r for r in reqs if _canonical(re.split(r"[\s<>=!~;\[(@]", r, maxsplit=1)[0]) not in dropped
    ]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> None:
    args = list(argv)
    extras_only = "--extras-only" in args
    args = [a for a in args if a != "--extras-only"]
    without: list[str] = []
    while "--without" in args:
        i = args.index("--without")
        without.append(args[i + 1])
        del args[i : i + 2]
    if not args:
        raise SystemExit(__doc__)
    extras = args[1] if len(args) > 1 else ""
    print("\n".join(requirements(args[0], extras, tuple(without), extras_only)))


if __name__ == "__main__":
    main(sys.argv[1:])
