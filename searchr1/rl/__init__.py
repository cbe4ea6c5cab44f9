"""The RL algorithm, knowing no run folder, console, config parsing or CLI (a test keeps it
so). Read top to bottom: ``job`` (the environment and the job a step runs over), ``rollout``
(the state machine: generate, search, read, continue, answer), ``advantages`` (the
estimators and the loss's aggregation), ``datums`` and ``batching`` (trajectory -> datum ->
micro-batches), ``step`` (``collect`` -> ``learn``) and ``pipeline`` (the steps in order,
later rollouts prefetched). The run around it (guard, records, checkpoints, evals, stops)
is :mod:`searchr1.core.train` and :mod:`searchr1.core.step`.
"""
