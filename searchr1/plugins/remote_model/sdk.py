"""Import a Tinker-shaped SDK, open its root ``ServiceClient``, and smooth over how the two
SDKs differ.

``pytrio`` and ``tinker`` share the user API the adapter needs (``ServiceClient``,
``create_lora_training_client``, ``Datum``, ``ModelInput``, ``TensorData``, ``SamplingParams``,
``AdamParams``, training calls that return a future with ``.result()``).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from searchr1.plugins.remote_model.settings import RemoteSettings
from searchr1.sdk import UserError

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
    service = sdk.ServiceClient(api_key=api_key, base_url=api_base)
    # tinker opens its session (client config, create_session, heartbeat, telemetry) on first
    # use; open it now, so a rejected key fails at login like PyTRIO's, and with telemetry off
    # unless [model.<provider>] telemetry = true (tinker reads TINKER_TELEMETRY only then).
    with _environment("TINKER_TELEMETRY", None if settings.telemetry else "0"):
        holder = getattr(type(service), "holder", None)
        if isinstance(holder, property):
            service.holder  # noqa: B018 -- the property creates the session
    return service


@contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """Set ``name`` to ``value`` for the block unless the user already set it."""
    if value is None or name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def resolve(client_or_future: Any, timeout: float | None = None) -> Any:
    """The answer of a future (TimeoutError after ``timeout`` seconds), or the client itself:
    tinker >= 0.38 returns a future of a training or sampling client (still usable as the
    client, with a FutureWarning); PyTRIO returns the client."""
    result = getattr(client_or_future, "result", None)
    return result(timeout=timeout) if callable(result) else client_or_future


async def submit(sdk: ModuleType, client: Any, call: str, *args: Any, **kwargs: Any) -> Any:
    """``client.<call>(...)`` submitted without blocking the event loop: the SDK's future of
    the answer, or the answer itself (PyTRIO's client creation); :func:`answer` awaits
    either."""
    if sdk.__name__ == "pytrio":
        return await getattr(client, f"{call}_async")(*args, **kwargs)
    return getattr(client, call)(*args, **kwargs)


async def answer(submitted: Any, timeout: float | None) -> Any:
    """What :func:`submit` returned, awaited (TimeoutError after ``timeout`` seconds)."""
    if not inspect.isawaitable(submitted):
        return submitted
    async with asyncio.timeout(timeout):
        return await submitted


async def sample(sampler: Any, **kwargs: Any) -> Any:
    """One ``sample`` call, awaited without blocking the caller's event loop."""
    if hasattr(sampler, "sample_async") and _module(sampler) == "pytrio":
        return await sampler.sample_async(**kwargs)
    return await sampler.sample(**kwargs)


def queues_sampler_save(sdk: ModuleType) -> bool:
    """Whether ``save_weights_and_get_sampling_client`` returns at once with a future that the
    SDK runs after the calls submitted before it (tinker orders a training client's calls by
    request id), so it can be submitted behind ``optim_step`` before anything is awaited."""
    return sdk.__name__ == "tinker"


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


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
