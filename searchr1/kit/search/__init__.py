"""The search reliability layer shared by every search provider plugin.

:mod:`.base` (:class:`BaseSearchProvider`: input checks, truncation, the run cache, per-call
metrics; a provider implements ``_fetch``), :mod:`.http_provider` (:class:`HttpSearchProvider`:
key rotation and benching, a concurrency limit, per-attempt metrics over :mod:`searchr1.kit.http`),
and the parts: :mod:`.keys`, :mod:`.batches`, :mod:`.cache`, :mod:`.metrics`, :mod:`.documents`.
"""
