"""The factory of ``builtin:tiny``'s shipped warm start (``scripts/build_warm_start.py`` runs
it; no ``searchr1`` command does):

- ``tiny_base``: the untrained model, a tokenizer trained on the world's texts;
- ``scripted_agent``: scripted trajectories of an untrained search agent;
- ``finetune``: the full-parameter supervised fine-tune on those trajectories.
"""
