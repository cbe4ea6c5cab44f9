"""Moved to :mod:`searchr1.rl.advantages`: this name stays the same module for imports written
before the move (bench scripts, plugins)."""

import sys

from searchr1.rl import advantages

sys.modules[__name__] = advantages
