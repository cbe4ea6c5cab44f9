"""What runs when nothing is chosen: the embedded offline demo config (``offline.toml``), the
plugins a config that names none gets, the config file a command or the Python API reads by
default, and the smoke question of the reference setup (docs/reference-setup.md, §2)."""

from __future__ import annotations

import os

#: The plugin each name-chosen setting runs when a config leaves it out (a distribution may
#: ship other defaults here; the core reads them, it names no plugin itself).
DEFAULT_NAMES: dict[str, str | tuple[str, ...]] = {
    "rollout.protocol": "tool_calls",
    "reward.name": "format_answer",
    "train.loss_fn": "importance_sampling",
    "train.cold_start.loss_fn": "cross_entropy",
}

DEFAULT_QUESTION = "Who is the author of The Little Prince and where was he born?"
#: The reference setup's example scores "France" 1.0 and "Paris" 0.0: the question asks who
#: wrote the book *and where he was born* (Lyon, France). So the golden answers are the
#: birthplace as country, city or both; the author's name alone is not golden, with it it is.
DEFAULT_ANSWERS = (
    "France",
    "Lyon",
    "Lyon, France",
    "Antoine de Saint-Exupéry, Lyon",
    "Antoine de Saint-Exupéry, France",
    "Antoine de Saint-Exupéry, Lyon, France",
)


def _config_from_env() -> str | None:
    """``$SEARCHR1_CONFIG`` when it names an existing file, else None (the embedded default).

    The container image sets it to ``/workspace/config.toml``, which exists only when the user
    has a config.toml in the project folder mounted there (compose.yaml): with one, every
    command uses it; without, they run the offline demo. ``--config`` always wins.
    """
    path = os.environ.get("SEARCHR1_CONFIG", "")
    return path if path and os.path.isfile(path) else None


def default_config_path() -> tuple[str | None, str]:
    """The config a command runs when ``--config`` is not given, and why: ``$SEARCHR1_CONFIG``
    when that file exists (the container image), else ``./config.toml`` when it exists (the
    reference setup's layout: config.toml and .env in the project folder), else the demo."""
    from_env = _config_from_env()
    if from_env is not None:
        return from_env, "$SEARCHR1_CONFIG names it and --config was not given"
    if os.path.isfile("config.toml"):
        return "config.toml", "./config.toml exists in the working directory; no --config given"
    return None, "no --config, no $SEARCHR1_CONFIG file and no ./config.toml: the offline demo"
