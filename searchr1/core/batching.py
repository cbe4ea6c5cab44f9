"""Moved to :mod:`searchr1.rl.batching`: this name stays the same module for imports written
before the move (bench scripts, plugins)."""

import sys

from searchr1.rl import batching

sys.modules[__name__] = batching
