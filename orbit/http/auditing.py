"""Audit of HTTP calls that fail after authentication.

A state-changing route declares what it is about to do with :func:`audit_intent` right after
authorising. On success the service writes the audit event inside its own transaction; on
failure (rolled back) the error handler calls :func:`audit_failure`, which writes the event
with outcome ``denied`` (403) or ``conflict`` (409/412/422/429) in a separate transaction.
Authorization denials (403 from :mod:`orbit.http.auth`) are audited there, even before an
intent exists. A failure answered by an ``error`` frame of an open WebSocket goes through
:func:`frame_failure` (same metric, same audit event). 400s, 404s and 5xx are not audited (they change nothing and a 404 must not
reveal more than an absent resource); they are counted in the request metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from orbit import audit
from orbit.audit import Actor, outcome_for_status
from orbit.errors import OrbitError
from orbit.metrics import count_conflict
from orbit.types import ZERO_ID

AUDITED_STATUSES = frozenset({403, 409, 412, 422, 429})


@dataclass(frozen=True, slots=True)
class AuditIntent:
    """What an authorised request is about to change."""

    action: str
    resource_kind: str
    resource_id: bytes | str | None = None
    namespace_id: bytes = ZERO_ID


def _state(conn: HTTPConnection) -> dict[str, object]:
    return conn.scope.setdefault("state", {})  # type: ignore[no-any-return]


def audit_intent(
    conn: HTTPConnection,
    action: str,
    resource_kind: str,
    resource_id: bytes | str | None = None,
    namespace_id: bytes = ZERO_ID,
) -> AuditIntent:
    """Declare the audited action of this request (used if it fails)."""
    intent = AuditIntent(action, resource_kind, resource_id, namespace_id)
    _state(conn)["audit"] = intent
    return intent


def request_id(conn: HTTPConnection) -> str | None:
    rid = _state(conn).get("request_id")
    return rid if isinstance(rid, str) else None


def actor_of(conn: HTTPConnection) -> Actor | None:
    principal = _state(conn).get("principal")
    return getattr(principal, "actor", None)


async def audit_failure(conn: HTTPConnection, exc: OrbitError) -> None:
    """Write the failed call's audit event (detached) when an intent was declared."""
    intent = _state(conn).get("audit")
    if isinstance(intent, AuditIntent):
        await record_failure(conn, exc, intent, actor_of(conn))


async def record_failure(
    conn: HTTPConnection, exc: OrbitError, intent: AuditIntent, actor: Actor | None
) -> None:
    """Write the audit event of a failed call (detached, once per error) for ``intent``
    when the failure is audited (403, 409, 412, 422, 429) and the actor is known."""
    if exc.status not in AUDITED_STATUSES or actor is None:
        return
    if getattr(exc, "audited", False):
        return
    ctx = conn.app.state.ctx
    await audit.record_detached(
        ctx.db,
        actor=actor,
        action=intent.action,
        resource_kind=intent.resource_kind,
        resource_id=intent.resource_id,
        outcome=outcome_for_status(exc.status),
        status_code=exc.status,
        namespace_id=intent.namespace_id,
        request_id=request_id(conn),
        details={"code": exc.code, **({"kind": exc.kind} if hasattr(exc, "kind") else {})},
    )
    exc.audited = True  # type: ignore[attr-defined]


#: Audit actions of a delivery's settlement (HTTP ``…/ack``, ``…/nack`` and stream frames).
ACK_ACTION = "deliveries.ack"
NACK_ACTION = "deliveries.nack"


async def settle_failure(
    ws: HTTPConnection, exc: OrbitError, nack: bool, delivery_id: str, namespace_id: bytes
) -> None:
    """:func:`frame_failure` of an ``ack``/``nack`` frame of a subscription stream (the
    stream's key is the actor)."""
    action = NACK_ACTION if nack else ACK_ACTION
    intent = AuditIntent(action, "delivery", delivery_id, namespace_id)
    await frame_failure(ws, exc, intent, actor_of(ws))


async def frame_failure(
    conn: HTTPConnection, exc: OrbitError, intent: AuditIntent, actor: Actor | None
) -> None:
    """A failure answered inside an open WebSocket (an ``error`` frame: the HTTP error
    handler never sees it), counted and audited exactly as that handler would: the conflict
    metric by kind, and the audit event of a 403/409/412/422/429."""
    from orbit.http.errors import conflict_kind

    ctx = getattr(conn.app.state, "ctx", None)
    if ctx is None:
        return
    kind = conflict_kind(exc)
    if kind is not None:
        count_conflict(ctx.metrics, kind)
    await record_failure(conn, exc, intent, actor)
