"""Error mapping: code → class, status fallback, Retry-After; handler error types."""

from __future__ import annotations

import email.utils
import json
import time

import pytest
from orbit_sdk import (
    Conflict,
    EffectUncertain,
    Forbidden,
    IdempotencyInProgress,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    NotReady,
    OrbitError,
    PayloadTooLarge,
    PermanentError,
    PreconditionFailed,
    QuotaExceeded,
    RateLimited,
    RetryableError,
    StaleToken,
    TaskError,
    Unauthenticated,
)
from orbit_sdk.errors import error_from_code, error_from_response, parse_retry_after

CASES = [
    (400, "invalid_request", InvalidRequest),
    (401, "unauthenticated", Unauthenticated),
    (403, "forbidden", Forbidden),
    (404, "not_found", NotFound),
    (409, "conflict", Conflict),
    (409, "stale_token", StaleToken),
    (409, "idempotency_in_progress", IdempotencyInProgress),
    (412, "precondition_failed", PreconditionFailed),
    (413, "payload_too_large", PayloadTooLarge),
    (422, "idempotency_mismatch", IdempotencyMismatch),
    (429, "quota_exceeded", QuotaExceeded),
    (429, "rate_limited", RateLimited),
    (503, "not_ready", NotReady),
]


def _body(code: str, message: str = "m", details: dict[str, object] | None = None) -> bytes:
    return json.dumps(
        {"error": {"code": code, "message": message, "details": details or {}}}
    ).encode()


@pytest.mark.parametrize(("status", "code", "cls"), CASES)
def test_each_code_maps_to_its_class(status: int, code: str, cls: type[OrbitError]) -> None:
    err = error_from_response(status, _body(code, "why", {"field": "queue"}), {})
    assert type(err) is cls
    assert isinstance(err, OrbitError)
    assert err.code == code and err.status == status and err.message == "why"
    assert err.details == {"field": "queue"}
    assert type(error_from_code(code, "x")) is cls  # WebSocket error frames too


def test_stale_token_is_a_conflict_and_invalid_request_names_the_field() -> None:
    err = error_from_response(409, _body("stale_token"), {})
    assert isinstance(err, Conflict) and isinstance(err, StaleToken)
    bad = error_from_response(400, _body("invalid_request", details={"field": "priority"}), {})
    assert isinstance(bad, InvalidRequest) and bad.field == "priority"


def test_retry_after_header_is_exposed_on_429_and_503() -> None:
    err = error_from_response(429, _body("quota_exceeded"), {"retry-after": "7"})
    assert isinstance(err, QuotaExceeded) and err.retry_after == 7
    err = error_from_response(429, _body("rate_limited"), {"retry-after": "2"})
    assert isinstance(err, RateLimited) and err.retry_after == 2
    err = error_from_response(503, _body("not_ready"), {})
    assert isinstance(err, NotReady) and err.retry_after is None


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3 and parse_retry_after(" 0 ") == 0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-1") is None
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = parse_retry_after(future)
    assert seconds is not None and 25 <= seconds <= 31


def test_unknown_code_keeps_the_code_and_falls_back_on_status() -> None:
    err = error_from_response(409, _body("brand_new_conflict"), {})
    assert type(err) is Conflict and err.code == "brand_new_conflict"
    err = error_from_response(418, _body("teapot"), {})
    assert type(err) is OrbitError and err.code == "teapot" and err.status == 418


def test_non_orbit_error_bodies_still_map_by_status() -> None:
    err = error_from_response(502, b"<html>bad gateway</html>", {})
    assert type(err) is OrbitError and err.code == "http_502" and "bad gateway" in err.message
    err = error_from_response(404, b"", {})
    assert type(err) is NotFound and err.code == "http_404"


def test_handler_errors() -> None:
    retry = RetryableError("later", retry_after_ms=500, details={"a": 1})
    assert retry.retryable and retry.retry_after_ms == 500 and retry.type == "RetryableError"
    perm = PermanentError("never", type="Validation")
    assert not perm.retryable and perm.type == "Validation" and perm.details is None
    uncertain = EffectUncertain("charge")
    assert isinstance(uncertain, PermanentError) and isinstance(uncertain, TaskError)
    assert uncertain.key == "charge" and uncertain.details == {"key": "charge"}
    assert not issubclass(TaskError, OrbitError)


def test_public_names_and_no_server_imports() -> None:
    import subprocess
    import sys

    import orbit_sdk

    assert len(set(orbit_sdk.__all__)) == len(orbit_sdk.__all__)
    for name in orbit_sdk.__all__:
        assert getattr(orbit_sdk, name) is not None
    probe = (
        "import sys, orbit_sdk, orbit_sdk.wire, orbit_sdk.sync, orbit_sdk.worker;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'orbit', 'pulse', 'weave'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", "the SDK must not import the server packages"
