"""How the remote provider makes one SDK call and reports its failure.

:class:`ServiceCalls` is the base of
:class:`~searchr1.plugins.remote_model.provider.RemoteModelProvider`: every SDK call goes
through :meth:`ServiceCalls._call` (an SDK exception becomes a
:class:`~searchr1.plugins.remote_model.errors.RemoteModelError` naming the operation, the
service and the key variable) and every wait for an answer through :meth:`ServiceCalls._wait`
(bounded by ``[model.<provider>] result_timeout_seconds``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from searchr1.plugins.remote_model.errors import RemoteModelError, RemoteServiceError, translate
from searchr1.plugins.remote_model.sdk import resolve
from searchr1.plugins.remote_model.settings import RemoteSettings

T = TypeVar("T")


class ServiceCalls:
    """Calls to one service; the subclass sets these attributes in its ``__init__``."""

    provider_name: str
    api_base: str
    _settings: RemoteSettings
    _key_name: str

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run one SDK call; translate its failure into a RemoteModelError."""
        try:
            return fn()
        except RemoteModelError:
            raise
        except TimeoutError as exc:  # concurrent.futures.TimeoutError is this one since 3.11
            raise RemoteServiceError(
                f"remote {operation} at {self.api_base}: no answer within "
                f"[model.{self.provider_name}] result_timeout_seconds = "
                f"{self._settings.result_timeout_seconds} s (the service is slow or failing "
                f"and the SDK kept retrying); raise it if the service queues work for longer"
            ) from exc
        except Exception as exc:
            raise self._translate(exc, operation) from exc

    def _wait(self, future: Any) -> Any:
        """The answer of a submitted call (or the client a tinker future resolves to), waiting
        at most ``result_timeout_seconds``: tinker retries a failing result poll forever."""
        return resolve(future, self._settings.result_timeout_seconds or None)

    def _translate(self, exc: BaseException, operation: str) -> RemoteModelError:
        """:func:`~searchr1.plugins.remote_model.errors.translate` with this provider's
        service URL, key name and retry budget."""
        return translate(
            exc,
            operation=operation,
            api_base=self.api_base,
            key_name=self._key_name,
            retry_seconds=self._settings.retry_timeout_seconds,
        )
