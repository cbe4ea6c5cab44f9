"""The search reliability layer shared by every search provider plugin.

* :mod:`.base` - :class:`BaseSearchProvider`: input checks, truncation, the run cache,
  per-call metrics; a provider implements ``_fetch``.
* :mod:`.http_provider` - :class:`HttpSearchProvider`: key rotation and benching, a
  concurrency limit and per-attempt metrics on top of :mod:`searchr1.kit.http` (the HTTP
  helper every plugin shares: retries with jitter, ``Retry-After``, pooled connections); HTTP
  providers implement ``_fetch`` with :meth:`HttpSearchProvider.request`.
* :mod:`.keys` (key health and benching), :mod:`.batches` (concurrent queries in one call),
  :mod:`.cache` (the run cache and the answers kept on disk), :mod:`.metrics`,
  :mod:`.documents` - the parts.
"""
