"""The search reliability layer shared by every search provider plugin.

* :mod:`.base` - :class:`BaseSearchProvider`: input checks, truncation, the run cache,
  per-call metrics; a provider implements ``_fetch``.
* :mod:`.http_provider` - :class:`HttpSearchProvider`: key rotation and benching, a
  concurrency limit and per-attempt metrics on top of :mod:`searchr1.kit.http` (the HTTP
  helper every plugin shares: retries with jitter, ``Retry-After``, pooled connections); HTTP
  providers implement ``_fetch`` with :meth:`HttpSearchProvider.request`.
* :mod:`.keys` (key health and benching), :mod:`.cache` (the run cache and the answers kept
  on disk), :mod:`.metrics`, :mod:`.documents` - the parts.
"""

from searchr1.kit.search.base import BaseSearchProvider
from searchr1.kit.search.cache import AnswerStore, QueryCache, normalise_query
from searchr1.kit.search.keys import KeyPool
from searchr1.kit.search.metrics import SearchMetrics

__all__ = [
    "AnswerStore",
    "BaseSearchProvider",
    "KeyPool",
    "QueryCache",
    "SearchMetrics",
    "normalise_query",
]
