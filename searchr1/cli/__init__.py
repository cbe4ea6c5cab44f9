"""The ``searchr1`` command line: one module per command, apart from the engine.

:mod:`searchr1.cli.main` builds the parser from each command module's ``add_parser`` and runs
the chosen command; :mod:`searchr1.cli.args` holds what several commands share (the
``--config`` choice, count flags). The commands (``train``, ``smoke``, ``eval``, ``report``,
``data check``, ``plugins``, ``config check``) read and print; the work they start lives in
:mod:`searchr1.core` (config, plugins, rollout, train loop, eval) and in the plugins.
``python -m searchr1.cli`` is the same as the ``searchr1`` console script.
"""
