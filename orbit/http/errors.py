"""Error rendering: every error a client sees is ``{"error": {"code", "message", "details"}}``.

One handler is registered on :class:`~orbit.errors.OrbitError` (subclasses of other packages
are found through the MRO), one on storage errors (translated to OrbitErrors by
:func:`client_error`, the mapping the WebSocket streams use too), one on Starlette's
HTTPException (unknown route 404, 405). The handler also

* counts conflicts by kind in ``orbit_conflicts_total{kind}`` (409 by the error's ``kind``,
  412 ``precondition_failed``, 422 ``idempotency_mismatch``, 429 by code);
* writes the audit event of a failed call when the route declared an audit intent (see
  :mod:`orbit.http.auditing`): 403 denials, 409/412/422/429 conflicts;
* on a WebSocket that was not accepted yet, answers the upgrade with the HTTP error itself
  (status and error body, through the ASGI denial-response extension, which uvicorn
  supports), logged once at info (:mod:`orbit.http.ws_refusal`); without the extension, or
  once accepted, closes it with code ``4000 + status`` (e.g. 4401, 4403, 4404).

``Retry-After`` comes from the error itself (429 and 503 always carry it).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketState

from orbit.errors import Conflict, InvalidRequest, NotFound, NotReady, OrbitError
from orbit.http.ws_refusal import refuse
from orbit.metrics import count_conflict
from orbit.storage import (
    CasConflict,
    CheckViolation,
    ConnectionRefused,
    NodeNotReady,
    OutcomeUnknown,
    PoolExhausted,
    StorageError,
    TransientExhausted,
)

log = logging.getLogger("orbit.http")


class ErrorInfo(msgspec.Struct, frozen=True):
    """The inner object of an error body."""

    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(msgspec.Struct, frozen=True):
    """``{"error": {"code", "message", "details"}}`` (docs/api/conventions.md#errors)."""

    error: ErrorInfo


_ENC = msgspec.json.Encoder()


def error_bytes(code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    return _ENC.encode(ErrorBody(ErrorInfo(code, message, details or {})))


def error_response(exc: OrbitError, request_id: str | None = None) -> Response:
    """The HTTP response of an OrbitError (status, body, Retry-After, X-Request-Id)."""
    headers = dict(exc.headers())
    if request_id:
        headers["X-Request-Id"] = request_id
    return Response(
        error_bytes(exc.code, exc.message, exc.details),
        status_code=exc.status,
        headers=headers,
        media_type="application/json",
    )


def conflict_kind(exc: OrbitError) -> str | None:
    """The ``kind`` label of ``orbit_conflicts_total`` for this error, or None."""
    if isinstance(exc, Conflict):
        return exc.kind
    if exc.status == 412:
        return "precondition_failed"
    if exc.status in (422, 429):
        return exc.code
    return None


#: Storage failures that mean "this database will not serve right now": 503 ``not_ready``
#: with ``Retry-After: 1`` and a ``reason``. A refused connection (max_user_connections /
#: max_connections) is shed like an exhausted pool (tests/reliability/
#: test_max_user_connections.py); a Galera node partitioned away or without quorum refuses
#: every query until it rejoins (tests/cluster/).
_NOT_READY: tuple[tuple[type[StorageError], str, str], ...] = (
    (TransientExhausted, "the database is busy, retry", "transaction_conflict"),
    (PoolExhausted, "every database connection is busy, retry", "pool_exhausted"),
    (
        OutcomeUnknown,
        "the outcome is unknown (connection lost during commit): read before retrying",
        "outcome_unknown",
    ),
    (ConnectionRefused, "the database refused a connection, retry", "connection_limit"),
    (
        NodeNotReady,
        "the database node is not part of its cluster's primary component, retry",
        "cluster_not_primary",
    ),
)


def client_error(exc: BaseException) -> OrbitError | None:
    """The error a client is told for ``exc`` — its HTTP status and body, the ``error`` frame
    of a WebSocket stream and its close code (:func:`ws_close_code`) — or None when ``exc`` is
    an internal failure (logged; 500 ``internal``). The one mapping the HTTP error handler,
    the worker stream and the subscription stream share."""
    if isinstance(exc, OrbitError):
        return exc
    if not isinstance(exc, StorageError):
        return None
    if isinstance(exc, CasConflict):
        return Conflict(str(exc), kind="cas")
    if isinstance(exc, CheckViolation):
        # Bad input that slipped past the service's validation.
        return InvalidRequest("the request violates a constraint", constraint=exc.constraint)
    for cls, message, reason in _NOT_READY:
        if isinstance(exc, cls):
            return NotReady(message, retry_after=1, reason=reason)
    return None


def ws_close_code(exc: OrbitError) -> int:
    """The close code of a WebSocket ended by ``exc`` once accepted: 4000 + its HTTP status
    (4401 session gone or unauthenticated, 4403, 4404…)."""
    return 4000 + exc.status


def _request_id(conn: HTTPConnection) -> str | None:
    state = conn.scope.get("state") or {}
    rid = state.get("request_id")
    return rid if isinstance(rid, str) else None


async def handle_orbit_error(conn: HTTPConnection, exc: Exception) -> Response | None:
    """Render an OrbitError, count conflicts, audit the failure of an audited call."""
    assert isinstance(exc, OrbitError)
    ctx = getattr(conn.app.state, "ctx", None)
    kind = conflict_kind(exc)
    if ctx is not None and kind is not None:
        count_conflict(ctx.metrics, kind)
    if ctx is not None:
        from orbit.http.auditing import audit_failure

        await audit_failure(conn, exc)
    if exc.status >= 500:
        log.warning("request %s failed: %s %s", _request_id(conn), exc.code, exc.message)
    if isinstance(conn, WebSocket):
        if (
            conn.application_state == WebSocketState.CONNECTING
            and "websocket.http.response" in conn.scope.get("extensions", {})
        ):
            # Not accepted yet: answer the upgrade with the real HTTP error (ASGI denial
            # response). A close before accept reaches the client as a bare HTTP 403.
            await refuse(conn, exc, error_response(exc, _request_id(conn)))
            return None
        if conn.application_state != WebSocketState.DISCONNECTED:
            await conn.close(code=ws_close_code(exc), reason=exc.code)
        return None
    return error_response(exc, _request_id(conn))


async def handle_storage_error(conn: HTTPConnection, exc: Exception) -> Response | None:
    """A storage failure as the client error it means (:func:`client_error`); any other is
    re-raised (500 ``internal``, logged)."""
    assert isinstance(exc, StorageError)
    err = client_error(exc)
    if err is None:
        raise exc
    return await handle_orbit_error(conn, err)


async def handle_http_exception(conn: HTTPConnection, exc: Exception) -> Response | None:
    """Starlette's own 404 (no route) / 405 in the API's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return await handle_orbit_error(conn, NotFound("route"))
    err = OrbitError(str(exc.detail))
    err.status = exc.status_code
    err.code = {405: "method_not_allowed", 400: "invalid_request"}.get(
        exc.status_code, "http_error"
    )
    response = await handle_orbit_error(conn, err)
    if response is not None and exc.headers:
        response.headers.update(exc.headers)
    return response


def exception_handlers() -> dict[Any, Any]:
    """The handlers to pass to ``Starlette(exception_handlers=...)``."""
    return {
        OrbitError: handle_orbit_error,
        StorageError: handle_storage_error,
        HTTPException: handle_http_exception,
    }
