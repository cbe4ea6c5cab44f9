"""Moved to :mod:`searchr1.kit.learner.sharded_learner` (the learner is shared with the ``vllm`` provider);
this path re-exports it."""

from searchr1.kit.learner.sharded_learner import *  # noqa: F403
from searchr1.sdk import moved_module

moved_module(__name__, "searchr1.kit.learner.sharded_learner")
