"""Import a Tinker-shaped SDK and open its root ``ServiceClient``.

``pytrio`` and ``tinker`` share the user API the adapter needs (``ServiceClient``,
``create_lora_training_client``, ``Datum``, ``ModelInput``, ``TensorData``, ``SamplingParams``,
``AdamParams``, futures with ``.result()`` and ``*_async`` twins); they differ only in how the
base URL and the retry budget are set, which is all this module knows about.

Called once per run by :meth:`RemoteModelProvider.from_config`.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

from searchr1.core.errors import UserError
from searchr1.plugins.remote_model.settings import RemoteSettings

INSTALL_HINT = "pip install 'searchr1[remote]'"


class MissingSDKError(ImportError, UserError):
    """The optional SDK is not installed."""


def import_sdk(name: str) -> ModuleType:
    """The SDK module, or a MissingSDKError that says how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingSDKError(
            f"the {name!r} SDK is not installed ({exc}); install the remote extra: "
            f"{INSTALL_HINT} (or pip install {name})"
        ) from exc


def open_service(sdk: ModuleType, api_base: str, api_key: str, settings: RemoteSettings) -> Any:
    """Authenticate and return the SDK's root ``ServiceClient``.

    PyTRIO reads its base URL and retry budget from a process-wide configuration that each
    ``ServiceClient`` copies when it is created, so it is set right before construction.
    Tinker takes the base URL as an argument.
    """
    if sdk.__name__ == "pytrio":
        sdk.configure_observability(enabled=settings.telemetry)
        options: dict[str, Any] = {}
        if settings.sdk_home:
            options["home"] = settings.sdk_home
        sdk.configure(
            **options,
            base_url=api_base,
            log_level="WARNING",
            request_timeout_seconds=settings.request_timeout_seconds,
            actor_event_submit_timeout_seconds=settings.request_timeout_seconds,
            retry_initial_delay_seconds=settings.retry_initial_delay_seconds,
            control_retry_timeout_seconds=settings.retry_timeout_seconds,
            training_retry_timeout_seconds=settings.retry_timeout_seconds,
            sampling_retry_timeout_seconds=settings.retry_timeout_seconds,
            sampling_timeout_seconds=settings.sampling_timeout_seconds,
            sampling_first_chunk_timeout_seconds=float(settings.sampling_timeout_seconds),
            sampling_chunk_idle_timeout_seconds=float(settings.sampling_timeout_seconds),
        )
        return sdk.ServiceClient(api_key=api_key)
    return sdk.ServiceClient(api_key=api_key, base_url=api_base)


def close_service(service: Any) -> None:
    """End the remote service session now rather than when the client is garbage collected."""
    close = getattr(service, "close", None)
    if callable(close):
        try:
            params = inspect.signature(close).parameters
        except (TypeError, ValueError):
            params = {}
        # tinker >= 0.38: close(status) marks the session finished and returns a future; the
        # session is over only once that future resolves.
        done = close("success") if "status" in params else close()
        result = getattr(done, "result", None)
        if callable(result):
            result(timeout=30)
        return
    # PyTRIO has no public close; its runtime's shutdown is what its finalizer calls.
    runtime = getattr(service, "_runtime", None)
    shutdown = getattr(runtime, "shutdown", None)
    if callable(shutdown):
        shutdown()
