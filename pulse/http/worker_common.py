"""What the worker stream (:mod:`pulse.http.worker_stream`) and the HTTP fallback
(:mod:`pulse.http.workers`) share: session authentication, binding a transport to this node,
starts and reports through the group commit, their counters, error frames and the audit
event of a refused report."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.websockets import WebSocket

from orbit.audit import Actor
from orbit.errors import InvalidRequest, OrbitError
from orbit.http.auditing import AuditIntent, record_failure
from orbit.http.auth import bearer_key
from orbit.http.errors import conflict_kind
from orbit.http.tenancy import enter_application
from orbit.ids import parse_id
from orbit.metrics import count_conflict
from pulse import attempts, sessions, wire
from pulse.errors import AttemptNotFound
from pulse.http.admission import Admission
from pulse.hub import CLOSE_REPLACED, Connection
from pulse.progress import check_progress
from pulse.recovery import release_session_offers

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

log = logging.getLogger("pulse.http.workers")


async def session_of(
    rt: PulseRuntime,
    conn: Request | WebSocket,
    sid: str | None = None,
    *,
    allow_ended: bool = False,
) -> sessions.SessionInfo:
    """The session the request's token names (401 when wrong, expired or closed, unless
    ``allow_ended``), entering its application's fair share of the pool."""
    token = bearer_key(conn)
    try:
        info = await sessions.authenticate(
            rt.db, conn.path_params["ns"], token, sid, allow_ended=allow_ended
        )
    except OrbitError:
        count_auth_failure(rt)
        raise
    enter_application(rt.ctx.tenant_hints, info.application_id, token)  # fair share, by tenant
    return info


def count_auth_failure(rt: PulseRuntime) -> None:
    rt.metrics.counter("orbit_auth_failures_total", "Requests rejected with 401", ()).inc()


async def bind(rt: PulseRuntime, conn: Connection) -> bool:
    """Make this node the session's holder, replacing an older transport here, index the
    attempts the session holds and re-send its outstanding offers. False: session gone."""
    hub, info = rt.hub, conn.info
    if not await sessions.attach_node(rt.db, info.namespace_id, info.session_id, hub.node_id):
        return False
    previous = hub.register(conn)
    if previous is not None:
        await previous.close(CLOSE_REPLACED, "replaced")
    for attempt_id in await sessions.held_attempts(rt.db, info.namespace_id, info.session_id):
        hub.track(attempt_id, conn.key)
    offers = await sessions.outstanding_offers(rt.db, info.namespace_id, info.session_id)
    if offers:
        await conn.send_offers(offers)
    return True


async def unbind(rt: PulseRuntime, conn: Connection) -> None:
    """The transport ended: if it was still the session's holder here, clear the node and
    give its unstarted offers back to the queue (running attempts keep their leases; the
    worker may reconnect and report)."""
    hub = rt.hub
    if not hub.unregister(conn):
        return
    info = conn.info
    try:
        detached = await sessions.detach_node(
            rt.db, info.namespace_id, info.session_id, hub.node_id
        )
        if detached and await release_session_offers(rt.db, info.namespace_id, info.session_id):
            hub.notify_new_work()
    except Exception:
        log.exception("cleanup of session stream failed")


def error_frame(rt: PulseRuntime, exc: OrbitError, ref: str | None) -> wire.Error:
    kind = conflict_kind(exc)  # counted as the HTTP error handler counts (409, 412, 429)
    if kind is not None:
        count_conflict(rt.metrics, kind)
    return wire.Error(
        code=exc.code, message=exc.message, ref_msg_id=ref, details=exc.details or None
    )


#: Audit action of each attempt-scoped worker message.
_ATTEMPT_ACTIONS: dict[type[Any], str] = {
    wire.Complete: "attempts.complete",
    wire.Fail: "attempts.fail",
    wire.Cancelled: "attempts.cancelled",
    wire.Effect: "attempts.effect",
}


async def audit_report_failure(
    conn: Request | WebSocket, info: sessions.SessionInfo, frame: Any, exc: OrbitError
) -> None:
    """The audit event of a refused report or effect (409 ``stale_token``, ``conflict``…),
    with the session's credential as the actor — over the stream and the HTTP fallback."""
    action = _ATTEMPT_ACTIONS.get(type(frame))
    if action is None:
        return
    intent = AuditIntent(action, "attempt", frame.attempt_id, info.namespace_id)
    await record_failure(conn, exc, intent, Actor(info.credential_id, info.application_id))


def attempt_id_of(text: str) -> bytes:
    attempt_id = parse_id(text)
    if attempt_id is None:
        raise AttemptNotFound()
    return attempt_id


def checked_progress(
    admission: Admission, progress: dict[str, msgspec.Raw] | None, attempt_ids: list[str]
) -> dict[str, str]:
    try:
        return check_progress(progress, attempt_ids)
    except InvalidRequest:
        admission.refused("progress")
        raise


def count_start(rt: PulseRuntime, reply: wire.Started | wire.StartDenied) -> None:
    outcome = "started" if isinstance(reply, wire.Started) else reply.reason
    rt.metrics.counter(
        "pulse_starts_total", "Start requests by outcome (started or the denial reason)",
        ("outcome",),
    ).inc(outcome=outcome)  # fmt: skip


def count_report(rt: PulseRuntime, op: str, outcome: str) -> None:
    rt.metrics.counter(
        "pulse_reports_total", "Result reports by operation and outcome", ("op", "outcome")
    ).inc(op=op, outcome=outcome)


async def start_attempt(
    rt: PulseRuntime, conn: Connection, attempt_hex: str
) -> wire.Started | wire.StartDenied:
    """A start over the stream: through the group commit, then the hub tracks the attempt
    (started) or forgets it and wakes the dispatcher (denied)."""
    attempt_id = parse_id(attempt_hex)
    info = conn.info
    if attempt_id is None:
        return wire.StartDenied(ref_msg_id=None, attempt_id=attempt_hex, reason="not_found")
    reply: wire.Started | wire.StartDenied = await rt.batches.start(
        info.namespace_id, info.session_id, attempt_id
    )
    count_start(rt, reply)
    if isinstance(reply, wire.Started):
        rt.hub.track(attempt_id, conn.key)
        if conn.depth_capped:  # an offer-depth slot freed
            conn.depth_capped = False
            rt.hub.notify_new_work()
    else:
        rt.hub.forget(attempt_id)
        rt.hub.notify_new_work()  # capacity freed, and the task may be back in its queue
    return reply


async def report_attempt(
    rt: PulseRuntime,
    namespace_id: bytes,
    attempt_hex: str,
    body: wire.Complete | wire.Fail | wire.Cancelled,
) -> wire.Receipt:
    """A result report (stream or HTTP) through the group commit."""
    attempt_id = attempt_id_of(attempt_hex)
    rep = attempts.Report.from_frame(body, attempt_id)
    try:
        receipt: wire.Receipt = await rt.batches.report(namespace_id, rep)
    except OrbitError as exc:
        count_report(rt, rep.op, exc.code)
        raise
    count_report(rt, rep.op, receipt.outcome)
    rt.hub.forget(attempt_id)
    rt.hub.notify_new_work()  # capacity freed (and a retried task may be due)
    return receipt
