"""Helpers for plugin authors: not the core, and the core never imports them.

The core (:mod:`searchr1.core`) holds the plugin contracts and the training loop. This
package holds what several plugins share and a third-party plugin may reuse:

* :mod:`.http` - one pooled HTTP client with retries, jitter, ``Retry-After`` and errors that
  name the URL but never a secret (:mod:`.retry` holds its arithmetic);
* :mod:`.search` - a base class for search providers (input checks, the run cache, per-call
  metrics) and one for HTTP search services (key rotation and benching on top of :mod:`.http`).
"""
