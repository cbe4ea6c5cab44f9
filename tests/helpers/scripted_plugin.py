"""The ``scripted`` model provider (:class:`fakes.ScriptedPlugin`) as a development plugin
module: the ``scripted_plugin`` fixture (``tests/conftest.py``) names it in
``$SEARCHR1_PLUGINS``, so every registry a command loads registers it exactly as it registers
a third-party plugin under development. :data:`PLUGIN` keeps the models it created."""

from __future__ import annotations

from fakes import ScriptedPlugin

PLUGIN = ScriptedPlugin()

register_model_providers = PLUGIN.register_model_providers
