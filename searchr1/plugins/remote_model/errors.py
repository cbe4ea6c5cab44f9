"""Errors of the remote model providers, and how an SDK exception becomes one of them.

The adapter wraps every SDK call in :func:`translate`; the train loop and the CLI then see one
of three clear errors instead of an SDK-specific exception:

* :class:`RemoteAuthError` -- the service rejected the key (HTTP 401/403). Printed as a user
  error (no traceback): "TAOTOKEN_API_KEY was rejected ...".
* :class:`RemoteServiceError` -- the request failed after the SDK's own retries (429, 5xx,
  connection errors, timeouts) or the service answered with a non-retryable error.
* :class:`RemoteStepError` -- a training call failed, so the remote optimizer state is no longer
  known to match the local step count; the run must resume from its last checkpoint.
"""

from __future__ import annotations

from searchr1.core.errors import UserError


class RemoteModelError(RuntimeError):
    """Base class of the remote provider errors."""


class RemoteAuthError(RemoteModelError, UserError):
    """The service rejected the API key."""


class RemoteServiceError(RemoteModelError):
    """A remote call failed after the SDK gave up retrying it."""

    def __init__(self, message: str, status_code: int = 0):
        super().__init__(message)
        self.status_code = status_code


class RemoteStepError(RemoteServiceError, UserError):
    """A training step failed part-way; continuing could apply it twice or half."""


_AUTH_CODES = frozenset(
    {"unauthorized", "forbidden", "api_key_expired", "api_key_revoked", "api_key_disabled"}
)


def status_of(exc: BaseException) -> int:
    """The HTTP status an SDK exception carries (PyTRIO and Tinker both call it status_code)."""
    status = getattr(exc, "status_code", 0)
    if not status:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", 0)
    return int(status) if isinstance(status, int) else 0


def is_auth_failure(exc: BaseException) -> bool:
    code = str(getattr(exc, "code", "") or "")
    return (
        status_of(exc) in (401, 403)
        or code in _AUTH_CODES
        or type(exc).__name__
        in (
            "AuthError",
            "AuthenticationError",
            "PermissionDeniedError",
        )
    )


def short_message(exc: BaseException) -> str:
    """The SDK's own one-line message (PyTRIO's ``str()`` appends hints and request context)."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def translate(
    exc: BaseException, *, operation: str, api_base: str, key_name: str, retry_seconds: float
) -> RemoteModelError:
    """Turn an SDK exception raised by ``operation`` into a RemoteModelError."""
    if isinstance(exc, RemoteModelError):
        return exc
    status = status_of(exc)
    if is_auth_failure(exc):
        what = f"HTTP {status}" if status else short_message(exc)
        return RemoteAuthError(
            f"{key_name} was rejected by {api_base} ({what}) during {operation}: check that the "
            f"key is valid and has access to this model; set it in the environment or in a .env "
            f"file next to the config"
        )
    status_text = f"HTTP {status}: " if status else ""
    return RemoteServiceError(
        f"remote {operation} at {api_base} failed: {status_text}{short_message(exc)} "
        f"(the SDK retries 408/429/5xx and timeouts for up to {retry_seconds:g} s before giving "
        f"up; raise [model.<provider>] retry_timeout_seconds to wait longer)",
        status_code=status,
    )
