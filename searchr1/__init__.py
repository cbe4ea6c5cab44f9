"""searchr1: train LLM search agents with reinforcement learning (Search-R1)."""

__version__ = "0.1.0"
