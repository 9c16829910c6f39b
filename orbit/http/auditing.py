"""Audit of HTTP calls that fail after authentication.

A state-changing route declares what it is about to do with :func:`audit_intent` right after
authorising. On success the service writes the audit event inside its own transaction; on
failure (rolled back) the error handler calls :func:`audit_failure`, which writes the event
with outcome ``denied`` (403) or ``conflict`` (409/412/422/429) in a separate transaction.
Authorization denials (403 from :mod:`orbit.http.auth`) are audited there, even before an
intent exists. 400s, 404s and 5xx are not audited (they change nothing and a 404 must not
reveal more than an absent resource); they are counted in the request metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from orbit import audit
from orbit.audit import Actor, outcome_for_status
from orbit.errors import OrbitError
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
    state = _state(conn)
    intent = state.get("audit")
    if not isinstance(intent, AuditIntent) or exc.status not in AUDITED_STATUSES:
        return
    if getattr(exc, "audited", False):
        return
    actor = actor_of(conn)
    if actor is None:
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
