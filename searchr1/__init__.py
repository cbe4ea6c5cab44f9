"""searchr1: train LLM search agents with reinforcement learning (Search-R1).

The command line is ``searchr1`` (:mod:`searchr1.cli`); the Python API that runs the reference
setup's smoke script (``run_rollout_group``, ``ZhihuSearchClient``) is :mod:`searchr1.api`.
"""

__version__ = "0.1.0"
