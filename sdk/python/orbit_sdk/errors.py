"""Errors raised by the SDK and errors a task handler raises to steer its report.

Errors that come back from the Orbit server (HTTP error bodies and WebSocket ``error``
frames) are mapped from their stable ``code`` to one class each::

    OrbitError                      any error reported by (or talking to) the server
     ├── InvalidRequest             400 invalid_request       (``field``: the offending field)
     ├── Unauthenticated            401 unauthenticated
     ├── Forbidden                  403 forbidden
     ├── NotFound                   404 not_found
     ├── Conflict                   409 conflict
     │    ├── StaleToken            409 stale_token           (execution token stale or wrong)
     │    ├── StaleProof            409 stale_proof           (delivery proof stale or wrong)
     │    └── IdempotencyInProgress 409 idempotency_in_progress
     ├── PreconditionFailed         412 precondition_failed   (If-Match / If-None-Match)
     ├── PayloadTooLarge            413 payload_too_large
     ├── IdempotencyMismatch        422 idempotency_mismatch
     ├── QuotaExceeded              429 quota_exceeded        (``retry_after`` seconds)
     ├── RateLimited                429 rate_limited          (``retry_after`` seconds)
     ├── NotReady                   503 not_ready             (``retry_after`` seconds or None)
     └── OrbitConnectionError       no answer: network failure or lost connection

A task handler raises these to choose how its attempt is reported::

    TaskError
     ├── RetryableError             fail, retryable, optional ``retry_after_ms``
     └── PermanentError             fail, not retryable
          └── EffectUncertain       ``ctx.effect`` found a begun-but-uncommitted effect

Any other exception from a handler is reported as a retryable failure unless the worker
is configured otherwise (``Worker(retry_unknown_errors=False)``).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from . import _json

__all__ = [
    "Conflict",
    "EffectUncertain",
    "Forbidden",
    "IdempotencyInProgress",
    "IdempotencyMismatch",
    "InvalidRequest",
    "NotFound",
    "NotReady",
    "OrbitConnectionError",
    "OrbitError",
    "PayloadTooLarge",
    "PermanentError",
    "PreconditionFailed",
    "QuotaExceeded",
    "RateLimited",
    "RetryableError",
    "StaleProof",
    "StaleToken",
    "TaskError",
    "Unauthenticated",
    "error_from_code",
    "error_from_response",
]


class OrbitError(Exception):
    """An error reported by the Orbit server, with its stable ``code`` and HTTP ``status``.

    ``details`` is the server's ``details`` object (possibly empty). ``status`` is the HTTP
    status the error was received with, or the class default for WebSocket ``error`` frames.
    """

    code: str = "internal"
    status: int = 500

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        status: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message or code or self.code)
        self.message = message or code or self.code
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details: dict[str, Any] = dict(details or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class InvalidRequest(OrbitError):
    """400: the request was malformed; ``field`` names the offending field when known."""

    code = "invalid_request"
    status = 400

    @property
    def field(self) -> str | None:
        value = self.details.get("field")
        return value if isinstance(value, str) else None


class Unauthenticated(OrbitError):
    """401: the API key (or session token) is missing, invalid, expired or revoked."""

    code = "unauthenticated"
    status = 401


class Forbidden(OrbitError):
    """403: the key is valid but lacks the action."""

    code = "forbidden"
    status = 403


class NotFound(OrbitError):
    """404: absent, or outside the caller's namespaces (the server does not say which)."""

    code = "not_found"
    status = 404


class Conflict(OrbitError):
    """409: a state or compare-and-swap conflict."""

    code = "conflict"
    status = 409


class StaleToken(Conflict):
    """409: the execution token is stale or wrong; the task was left untouched."""

    code = "stale_token"


class StaleProof(Conflict):
    """409: the delivery proof is wrong, or a newer hand-out replaced it (the delivery comes
    again with a new proof)."""

    code = "stale_proof"


class IdempotencyInProgress(Conflict):
    """409: another request with the same Idempotency-Key is still being processed."""

    code = "idempotency_in_progress"


class PreconditionFailed(OrbitError):
    """412: ``If-Match`` did not match the current ETag (or ``If-None-Match: *`` hit)."""

    code = "precondition_failed"
    status = 412


class PayloadTooLarge(OrbitError):
    """413: the request body exceeds the server's limit."""

    code = "payload_too_large"
    status = 413


class IdempotencyMismatch(OrbitError):
    """422: the Idempotency-Key was used before with a different request."""

    code = "idempotency_mismatch"
    status = 422


class _RetryAfterError(OrbitError):
    """An error that tells the caller when to try again (``retry_after`` seconds)."""

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        status: int | None = None,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code, status=status, details=details)
        self.retry_after = retry_after


class QuotaExceeded(_RetryAfterError):
    """429: a quota (unfinished tasks, active attempts, ...) is exhausted."""

    code = "quota_exceeded"
    status = 429


class RateLimited(_RetryAfterError):
    """429: a rate limit was hit."""

    code = "rate_limited"
    status = 429


class NotReady(_RetryAfterError):
    """503: the server is not ready (database unreachable, migrations pending)."""

    code = "not_ready"
    status = 503


class OrbitConnectionError(OrbitError):
    """The server could not be reached, or the connection was lost before an answer."""

    code = "connection_error"
    status = 0


_BY_CODE: dict[str, type[OrbitError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthenticated,
        Forbidden,
        NotFound,
        Conflict,
        StaleToken,
        StaleProof,
        IdempotencyInProgress,
        PreconditionFailed,
        PayloadTooLarge,
        IdempotencyMismatch,
        QuotaExceeded,
        RateLimited,
        NotReady,
    )
}

_BY_STATUS: dict[int, type[OrbitError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    422: IdempotencyMismatch,
    429: RateLimited,
    503: NotReady,
}


def error_from_code(
    code: str,
    message: str = "",
    *,
    status: int | None = None,
    details: Mapping[str, Any] | None = None,
    retry_after: float | None = None,
) -> OrbitError:
    """Build the error class for ``code``; an unknown code falls back to the HTTP status.

    The result always keeps the server's ``code`` string, so an unknown code is never lost.
    """
    cls = (
        _BY_CODE.get(code) or (_BY_STATUS.get(status) if status is not None else None) or OrbitError
    )
    if issubclass(cls, _RetryAfterError):
        if retry_after is None and details is not None:
            retry_after = _as_seconds(details.get("retry_after"))
        return cls(message, code=code, status=status, details=details, retry_after=retry_after)
    return cls(message, code=code, status=status, details=details)


def error_from_response(status: int, body: bytes, headers: Mapping[str, str]) -> OrbitError:
    """Map an HTTP error response (``{"error": {"code", "message", "details"}}``) to its class.

    A body that is not the Orbit error shape (a proxy's HTML page, say) still yields the
    class for the status, with code ``http_<status>``.
    """
    code, message = f"http_{status}", ""
    details: dict[str, Any] = {}
    try:
        doc = _json.decode(body)  # an error's details may hold any number
    except (msgspec.DecodeError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        code = str(err.get("code") or code)
        message = str(err.get("message") or "")
        details = err.get("details") if isinstance(err.get("details"), dict) else {}
    if not message:
        message = body[:200].decode("utf-8", "replace") if doc is None else code
    retry_after = parse_retry_after(headers.get("retry-after"))
    return error_from_code(code, message, status=status, details=details, retry_after=retry_after)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    seconds = _as_seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _as_seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


class TaskError(Exception):
    """Base of the errors a task handler raises to choose how its attempt is reported.

    ``type`` becomes ``error.type`` in the report (default: the class name) and
    ``details`` its ``error.details``.
    """

    retryable: bool = True

    def __init__(
        self, message: str, *, type: str | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type or self.__class__.__name__
        self.details: dict[str, Any] | None = dict(details) if details is not None else None


class RetryableError(TaskError):
    """Fail this attempt and let the server retry the task (per its retry policy).

    ``retry_after_ms`` asks the server to wait at least that long before the next attempt.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        retry_after_ms: int | None = None,
        *,
        type: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, type=type, details=details)
        self.retry_after_ms = retry_after_ms


class PermanentError(TaskError):
    """Fail this attempt and tell the server not to retry the task."""

    retryable = False


class EffectUncertain(PermanentError):
    """``ctx.effect(key, ...)`` found the effect begun but never committed.

    A previous attempt may or may not have performed it; the handler decides (catch this
    and check the outside world), or lets it propagate: the attempt is then reported as a
    non-retryable failure of type ``EffectUncertain`` for review.
    """

    def __init__(self, key: str) -> None:
        super().__init__(
            f"effect {key!r} was begun by an earlier attempt but never committed",
            details={"key": key},
        )
        self.key = key
