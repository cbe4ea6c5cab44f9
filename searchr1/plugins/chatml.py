"""Moved to :mod:`searchr1.kit.chatml` (other plugins reuse it); this path re-exports it."""

from searchr1.kit.chatml import *  # noqa: F403
from searchr1.sdk import moved_module

moved_module(__name__, "searchr1.kit.chatml")
