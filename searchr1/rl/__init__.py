"""The RL algorithm; it knows no run folder, console, config parsing or CLI (a test keeps it
so). Read top to bottom: ``job`` (what a step runs over), ``rollout`` (the state machine),
``advantages``, ``datums`` and ``batching`` (trajectory -> datum -> micro-batches), ``step``
(``collect`` -> ``learn``) and ``pipeline`` (the steps in order, later rollouts prefetched).
The run around it (guard, records, checkpoints, evals, stops) is :mod:`searchr1.core.train`.
"""
