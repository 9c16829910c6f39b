"""Orbit's error hierarchy. Every error has a stable ``code`` and an HTTP ``status``.

OrbitError (500 internal)
 ├── InvalidRequest        400 invalid_request        (``field`` names the offending field)
 ├── Unauthenticated       401 unauthenticated
 ├── Forbidden             403 forbidden
 ├── NotFound              404 not_found              (same body for absent and not-yours)
 ├── Conflict              409 conflict               (state or CAS; ``kind`` for metrics)
 │    ├── StaleToken       409 stale_token
 │    └── IdempotencyInProgress 409 idempotency_in_progress
 ├── RequestTimeout        408 request_timeout        (the body did not arrive in time)
 ├── PreconditionFailed    412 precondition_failed    (If-Match / If-None-Match)
 ├── PayloadTooLarge       413 payload_too_large
 ├── UnsupportedMediaType  415 unsupported_media_type (a body that is not JSON)
 ├── IdempotencyMismatch   422 idempotency_mismatch
 ├── QuotaExceeded         429 quota_exceeded         (``retry_after`` seconds)
 ├── RateLimited           429 rate_limited           (``retry_after`` seconds)
 └── NotReady              503 not_ready              (``retry_after`` seconds, optional)

Packages subclass these (``pulse.errors.PulseError`` etc.); the HTTP layer registers one
handler on OrbitError and renders ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

from typing import Any


class OrbitError(Exception):
    """Base of every error that reaches a client. Carries fields, not formatted strings."""

    code: str = "internal"
    status: int = 500

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}

    def headers(self) -> dict[str, str]:
        """Extra response headers (e.g. Retry-After)."""
        return {}


class InvalidRequest(OrbitError):
    code = "invalid_request"
    status = 400

    def __init__(self, message: str, field: str | None = None, **details: Any) -> None:
        super().__init__(message, field=field, **details)
        self.field = field


class Unauthenticated(OrbitError):
    code = "unauthenticated"
    status = 401


class Forbidden(OrbitError):
    code = "forbidden"
    status = 403


class NotFound(OrbitError):
    """Absent, or not visible to the caller: the body must not tell which."""

    code = "not_found"
    status = 404

    def __init__(self, resource: str = "resource") -> None:
        super().__init__(f"{resource} not found")
        self.details = {}


class Conflict(OrbitError):
    """A state or CAS conflict. ``kind`` labels the conflicts metric."""

    code = "conflict"
    status = 409

    def __init__(self, message: str, kind: str = "state", **details: Any) -> None:
        super().__init__(message, **details)
        self.kind = kind


class StaleToken(Conflict):
    code = "stale_token"

    def __init__(self, message: str = "execution token is stale or wrong", **details: Any) -> None:
        super().__init__(message, kind="stale_token", **details)


class IdempotencyInProgress(Conflict):
    code = "idempotency_in_progress"

    def __init__(self, message: str = "a request with this Idempotency-Key is in progress") -> None:
        super().__init__(message, kind="idempotency_in_progress")


class PreconditionFailed(OrbitError):
    code = "precondition_failed"
    status = 412


class RequestTimeout(OrbitError):
    code = "request_timeout"
    status = 408

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}  # the rest of the body is never read


class PayloadTooLarge(OrbitError):
    code = "payload_too_large"
    status = 413


class UnsupportedMediaType(OrbitError):
    code = "unsupported_media_type"
    status = 415


class IdempotencyMismatch(OrbitError):
    code = "idempotency_mismatch"
    status = 422


class _RetryAfter(OrbitError):
    def __init__(self, message: str, retry_after: int = 1, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = max(1, int(retry_after))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class QuotaExceeded(_RetryAfter):
    code = "quota_exceeded"
    status = 429


class RateLimited(_RetryAfter):
    code = "rate_limited"
    status = 429


class NotReady(_RetryAfter):
    code = "not_ready"
    status = 503
