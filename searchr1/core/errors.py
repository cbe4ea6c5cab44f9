"""The one family of errors searchr1 raises on purpose, and the exit code of each.

Every error the CLI prints as a plain message (no traceback) derives from
:class:`SearchR1Error`; ``exit_code`` is what ``searchr1`` exits with (README, "Exit
codes"). A message names the field, file or variable to fix.
"""

from __future__ import annotations

import signal
from typing import ClassVar

from searchr1.core.old_imports import warn_plugins

#: ``searchr1 train`` stopped because search stayed down (see :class:`EnvironmentDown`).
EXIT_ENVIRONMENT_DOWN = 3
#: a write failed because of the disk, not searchr1 (see :class:`DiskError`).
EXIT_DISK = 4
#: ``searchr1 train`` stopped on a health alert (see :class:`HealthStop`).
EXIT_HEALTH_STOP = 5


class SearchR1Error(Exception):
    """The root: an error searchr1 reports as a message and an exit code, not a traceback."""

    exit_code: int = 1


class UserError(SearchR1Error):
    """A problem the user can fix; the CLI prints it without a traceback (exit code 2)."""

    exit_code = 2


class ConfigValueError(UserError, ValueError):
    """A config value that passed validation but is unusable when used (a model that does not
    load, a prompt over the trajectory budget); names the field. Also a ``ValueError``."""


class ConfigError(SearchR1Error):
    """Every problem found in one config file, one per line (exit code 2)."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(SearchR1Error):
    """A plugin failed to load, clashes, or is not installed (exit code 2)."""

    exit_code = 2


class EnvironmentDown(SearchR1Error, RuntimeError):
    """Search stayed broken: past the guard's retries in ``train``, or too often for ``eval``'s
    scores to be trusted (exit code 3; also a ``RuntimeError``)."""

    exit_code = EXIT_ENVIRONMENT_DOWN


class RemoteError(SearchR1Error):
    """A remote service failed for good (after its retries). ``failure`` is the class's short
    name (:data:`REMOTE_FAILURES`), ``url`` the address without query string or user info,
    ``status`` the HTTP status when there was one; the message (built by
    :meth:`searchr1.kit.http.Channel.error`) names the URL, the class and what to do, never
    a key."""

    failure: ClassVar[str] = ""
    #: what a person reads in a diagnosis line: ``"dns: the host name does not resolve"``
    summary: ClassVar[str] = ""
    #: what to do, filled with the channel's facts by :meth:`searchr1.kit.http.Channel.error`:
    #: {host} {port} {address} (the setting holding the URL) {key} (the key's variable or
    #: setting) {rerun} {limit} {raise_timeout} {model} {model_setting} {wait} {other_key}
    fix: ClassVar[str] = "The service's answer says why; fix the request's settings accordingly"

    def __init__(
        self, message: str, *, url: str = "", status: int | None = None, service: str = ""
    ):
        #: what failed, as a person names it ("the reward judge"); "" when not known
        self.url, self.status, self.service = url, status, service
        super().__init__(message)


class RemoteHostUnknown(RemoteError):
    """The host name does not resolve (DNS): a typo in the address, or no network."""

    exit_code, failure, summary = 2, "dns", "the host name does not resolve (DNS)"
    fix = (
        "Check the host name {host!r} in {address}, and that this machine reaches "
        "the network (DNS, proxy settings)"
    )


class RemoteTLSError(RemoteError):
    """The TLS handshake failed: a certificate not trusted, or https:// to a plain-HTTP port."""

    exit_code, failure, summary = 2, "tls", "the TLS handshake failed"
    fix = (
        "If the server at {host}:{port} speaks plain HTTP, write http:// in {address}; "
        "otherwise its certificate is not trusted here (SSL_CERT_FILE, a proxy that intercepts TLS)"
    )


class RemoteAuthError(RemoteError):
    """HTTP 401/403: the key is empty, wrong, expired or not allowed this model."""

    exit_code, failure, summary = 2, "auth", "401/403: the service rejected the key"
    fix = (
        "{key} is empty or wrong (or not allowed this model): set it in the "
        "environment or in a .env file next to the config"
    )


class RemoteUnknownModel(RemoteError):
    """HTTP 404 or the service's "model not found": the model (or the path) is not served."""

    exit_code, failure, summary = 2, "unknown_model", "404: the model or path is not served"
    fix = (
        "Check that the model {model}is one this service serves ({model_setting}), "
        "and the path in {address}"
    )


class RemoteRejected(RemoteError):
    """Another 4xx: the service refuses this request as sent (a setting it does not accept)."""

    exit_code, failure, summary = 2, "rejected", "the service refused the request (4xx)"


class RemoteMalformed(RemoteError):
    """An answer that is not the service's API (not JSON, a missing field, an HTML page)."""

    exit_code, failure, summary = 2, "malformed", "the answer is not the service's API"
    fix = (
        "Check that {address} points at the API itself (not a web page or a "
        "proxy's page), and that the server runs a version this client speaks"
    )


class RemoteRefused(RemoteError):
    """The connection was refused: nothing listens on that host and port."""

    exit_code, failure, summary = 3, "refused", "connection refused (nothing listens there)"
    fix = (
        "Is the server running on port {port} of {host}? Start it, or fix the port in "
        "{address}; {rerun}"
    )


class RemoteConnectionLost(RemoteError):
    """The connection was reset or closed before the answer was complete."""

    exit_code, failure, summary = 3, "connection", "the connection was reset or dropped"
    fix = "The service or a proxy on the way closed the connection: {rerun}"


class RemoteTimeout(RemoteError):
    """No answer within the timeout, retries included."""

    exit_code, failure, summary = 3, "timeout", "no answer within the timeout"
    fix = "The service did not answer{limit}: {raise_timeout}or check the service; {rerun}"


class RemoteRateLimited(RemoteError):
    """HTTP 429 past the retries: the key is over its rate or quota."""

    exit_code, failure, summary = 3, "rate_limit", "429: the service is rate limiting this key"
    fix = "Wait {wait}{other_key}; {rerun}"


class RemoteServerError(RemoteError):
    """HTTP 5xx past the retries: the service itself is failing."""

    exit_code, failure, summary = 3, "server_error", "5xx: the service is failing"
    fix = "The service itself is failing: wait, {rerun}"


#: every class of remote failure by its short name, in the order a reader checks them
REMOTE_FAILURES: dict[str, type[RemoteError]] = {
    cls.failure: cls
    for cls in (
        RemoteHostUnknown,
        RemoteRefused,
        RemoteTLSError,
        RemoteConnectionLost,
        RemoteTimeout,
        RemoteAuthError,
        RemoteUnknownModel,
        RemoteRateLimited,
        RemoteServerError,
        RemoteRejected,
        RemoteMalformed,
    )
}


class RemoteStepError(RemoteError):
    """A remote training call failed part-way, so the service's step state is unknown and the
    run must be resumed from its last checkpoint. Keeps its cause's class and exit code."""

    def __init__(self, message: str, cause: RemoteError):
        super().__init__(message, url=cause.url, status=cause.status)
        self.failure, self.summary = cause.failure, cause.summary  # type: ignore[misc]
        self.exit_code = cause.exit_code


class DiskError(SearchR1Error):
    """The filesystem refused a write (ENOSPC, EDQUOT, EROFS, EIO, EACCES, EPERM): the
    message names the path, the free space there, the run's last complete checkpoint and the
    command that continues it (exit code 4). Built by :func:`searchr1.core.disk.disk_error`."""

    exit_code = EXIT_DISK


class Interrupted(SearchR1Error):
    """SIGINT/SIGTERM stopped the command (:mod:`searchr1.core.stop`) during ``phase``;
    ``kept`` says what it saved, ``then`` how to go on (the command that continues). Exits
    128 + the signal (130, 143) as a shell does, so ``searchr1 train && searchr1 eval`` stops
    after Ctrl-C; the CLI prints it as a stop, not an error."""

    def __init__(self, signum: int, phase: str, kept: str = "", then: str = ""):
        self.signum, self.phase, self.kept, self.then = signum, phase, kept, then
        lines = [f"stopped by {signal.Signals(signum).name} during {phase}"]
        lines += [f"kept: {kept}"] if kept else []
        lines += [then] if then else []
        super().__init__("\n".join(lines))

    def outcome(self, kept: str, then: str) -> Interrupted:
        """This stop with what the command kept and how to go on."""
        return Interrupted(self.signum, self.phase, kept, then)

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return 128 + self.signum


class HealthStop(SearchR1Error):
    """A health alert stopped training (``[train.health] on_alert = "stop"``) after the
    step that raised it was checkpointed (exit code 5)."""

    exit_code = EXIT_HEALTH_STOP

    def __init__(self, kind: str, message: str, step: int):
        self.kind, self.step = kind, step
        super().__init__(
            f"health alert {kind} at step {step}: {message}. The run stopped after saving "
            f'checkpoint step {step} ([train.health] on_alert = "stop"; "warn" only logs '
            f"alerts)"
        )


warn_plugins(__name__)  # a plugin imports searchr1.sdk instead: warned once
