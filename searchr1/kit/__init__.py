"""Helpers for plugin authors: not the core, and the core never imports them.

What several plugins share and a third-party plugin may reuse: :mod:`.http` (one pooled HTTP
client with retries and errors that name the URL but never a secret), :mod:`.search` (bases
for search providers: input checks, the run cache, key rotation), :mod:`.judge`,
:mod:`.tokenizers`, :mod:`.gguf` and :mod:`.hub` (model paths), :mod:`.learner` (the local
LoRA learner and its trainer), :mod:`.protocols` (the agent protocols and tool-call formats)
and :mod:`.chatml` (rendered ChatML read back into messages). No plugin imports another.
"""
