"""Worker routes: session creation, the WebSocket stream, and the HTTP fallback.

* ``POST /v1/namespaces/{ns}/workers/sessions`` — API key with ``workers.connect``.
* ``DELETE /v1/namespaces/{ns}/workers/sessions/{sid}`` — close the session (session token).
* ``GET  /v1/namespaces/{ns}/workers/sessions/{sid}/stream`` — WebSocket, session token.
* ``POST /v1/namespaces/{ns}/workers/sessions/{sid}/poll?wait_ms=`` — long-poll offers.
* ``POST /v1/namespaces/{ns}/workers/sessions/{sid}/heartbeat`` — session keep-alive.
* ``POST /v1/namespaces/{ns}/attempts/{aid}/start|heartbeat|complete|fail|cancelled|effect``.

Session-token routes answer 401 for a wrong/expired token (a WebSocket is closed with 4401
before it is accepted) — except the report and effect routes, which accept the token of an
ended session (the execution token fences them; a late report becomes evidence). Handlers only decode, authenticate and translate; the rules live in
:mod:`pulse.sessions`, :mod:`pulse.attempts`, :mod:`pulse.effects`. The protocol, message by
message, is in docs/api/workers.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from orbit.audit import Actor
from orbit.errors import (
    InvalidRequest,
    NotFound,
    OrbitError,
    PayloadTooLarge,
    RateLimited,
    Unauthenticated,
)
from orbit.http.auditing import AuditIntent, audit_intent, record_failure, request_id
from orbit.http.auth import authorize, bearer_key
from orbit.http.body import check_depth, decode, decode_optional, query_int
from orbit.http.errors import client_error, conflict_kind, error_response
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.http.tenancy import enter_application
from orbit.http.ws_refusal import refuse
from orbit.ids import parse_id
from orbit.metrics import count_conflict
from pulse import attempts, effects, sessions, wire
from pulse.batcher import WorkerBatches
from pulse.dispatch import Dispatcher
from pulse.errors import AttemptNotFound, SessionGone
from pulse.http.admission import (
    CLOSE_POLICY,
    admission_of,
    check_attempt_ids,
    error_bucket,
    frame_bucket,
)
from pulse.hub import (
    CLOSE_REPLACED,
    CLOSE_SESSION_GONE,
    Connection,
    Hub,
    PollConnection,
    WsConnection,
)
from pulse.keyed_waiting import KeyedWaitingCheck
from pulse.progress import check_progress
from pulse.recovery import release_session_offers
from pulse.runtime import DISPATCHER_KEY, hub_of

log = logging.getLogger("pulse.http.workers")

CONNECT = "workers.connect"
#: Frames of one stream handled at the same time (the rest wait: backpressure).
MAX_INFLIGHT_FRAMES = 32
DEFAULT_POLL_WAIT_MS = 10_000


def _ctx(conn: Request | WebSocket) -> Any:
    return conn.app.state.ctx


def _max_depth(conn: Request | WebSocket) -> int:
    return int(_ctx(conn).settings.max_json_depth)


def _dispatcher(ctx: Any, hub: Hub) -> Dispatcher:
    d = ctx.extras.get(DISPATCHER_KEY)
    if not isinstance(d, Dispatcher):
        d = Dispatcher(ctx.db, hub, metrics=getattr(ctx, "metrics", None))
        ctx.extras[DISPATCHER_KEY] = d
    return d


BATCHES_KEY = "pulse.worker_batches"


def _batches(ctx: Any) -> WorkerBatches:
    """This node's group commit of starts and reports (pulse/batcher.py), made on first use."""
    b = ctx.extras.get(BATCHES_KEY)
    if not isinstance(b, WorkerBatches):
        b = WorkerBatches(ctx.db)
        ctx.extras[BATCHES_KEY] = b
        metrics = getattr(ctx, "metrics", None)
        if metrics is not None:
            batches = metrics.gauge(
                "pulse_group_commit_batches", "Transactions run by the group commit", ("kind",)
            )
            items = metrics.gauge(
                "pulse_group_commit_items", "Worker messages applied by group commit", ("kind",)
            )
            largest = metrics.gauge(
                "pulse_group_commit_largest", "Largest batch so far", ("kind",)
            )

            def collect(b: WorkerBatches = b) -> None:
                for kind, gc in (("start", b.starts), ("report", b.reports),
                                 ("heartbeat", b.heartbeats)):  # fmt: skip
                    batches.set(gc.stats.batches, kind=kind)
                    items.set(gc.stats.items, kind=kind)
                    largest.set(gc.stats.largest, kind=kind)

            metrics.add_collector(collect)
    return b


async def _session(
    conn: Request | WebSocket, sid: str | None = None, *, allow_ended: bool = False
) -> sessions.SessionInfo:
    ctx = _ctx(conn)
    token = bearer_key(conn)
    try:
        info = await sessions.authenticate(
            ctx.db, conn.path_params["ns"], token, sid, allow_ended=allow_ended
        )
    except OrbitError:
        ctx.metrics.counter("orbit_auth_failures_total", "Requests rejected with 401", ()).inc()
        raise
    enter_application(ctx.extras, info.application_id, token)  # fair share, by tenant
    return info


# -- session creation ------------------------------------------------------------------------


@api(
    "Open a worker session (returns the session token once)",
    body=wire.SessionCreate,
    responses={201: wire.SessionCreated},
    errors=(400, 401, 403, 404, 409),
    action=CONNECT,
    tags=["workers"],
)
async def create_session(request: Request) -> Response:
    ns = request.path_params["ns"]
    p = await authorize(request, CONNECT, ns)
    assert p.namespace_id is not None
    audit_intent(request, CONNECT, "worker_session", None, p.namespace_id)
    body = decode(await request.body(), wire.SessionCreate, max_depth=_max_depth(request))
    ctx = _ctx(request)
    created = await sessions.create_session(
        ctx.db,
        namespace_id=p.namespace_id,
        application_id=p.application_id,
        credential_id=p.credential_id,
        allowed_queues=p.queues,
        body=body,
        settings=hub_of(ctx).settings,
        actor=p.actor,
        request_id=request_id(request),
    )
    return json_response(created, 201)


@api(
    "Close a worker session (graceful drain): offers released, running attempts recovered",
    responses={200: wire.SessionClosed},
    errors=(401,),
    tags=["workers"],
)
async def close_session(request: Request) -> Response:
    """``DELETE /v1/namespaces/{ns}/workers/sessions/{sid}`` with the session token. Closing
    an already closed or expired session answers 200 with its state (a re-sent close)."""
    ctx = _ctx(request)
    hub = hub_of(ctx)
    info = await _session(request, request.path_params["sid"], allow_ended=True)
    answer, ended = await sessions.close_session(ctx.db, info.namespace_id, info.session_id)
    for attempt_id in ended:
        hub.forget(attempt_id)
    if answer.state == "CLOSED":
        # Its stream on this node ends now; on another node at its next heartbeat (4401).
        await hub.close_session(
            info.namespace_id, info.session_id, CLOSE_SESSION_GONE, "session_closed"
        )
    if ended:
        hub.notify_new_work()
    return json_response(answer)


# -- the WebSocket stream --------------------------------------------------------------------


async def _bind(ctx: Any, hub: Hub, conn: Connection) -> bool:
    """Make this node the session's holder, replacing an older transport here, index the
    attempts the session holds and re-send its outstanding offers. False: session gone."""
    info = conn.info
    if not await sessions.attach_node(ctx.db, info.namespace_id, info.session_id, hub.node_id):
        return False
    previous = hub.register(conn)
    if previous is not None:
        await previous.close(CLOSE_REPLACED, "replaced")
    for attempt_id in await sessions.held_attempts(ctx.db, info.namespace_id, info.session_id):
        hub.track(attempt_id, conn.key)
    offers = await sessions.outstanding_offers(ctx.db, info.namespace_id, info.session_id)
    if offers:
        await conn.send_offers(offers)
    return True


async def _unbind(ctx: Any, hub: Hub, conn: Connection) -> None:
    """The transport ended: if it was still the session's holder here, clear the node and
    give its unstarted offers back to the queue (running attempts keep their leases; the
    worker may reconnect and report)."""
    if not hub.unregister(conn):
        return
    info = conn.info
    try:
        detached = await sessions.detach_node(
            ctx.db, info.namespace_id, info.session_id, hub.node_id
        )
        if detached and await release_session_offers(ctx.db, info.namespace_id, info.session_id):
            hub.notify_new_work()
    except Exception:
        log.exception("cleanup of session stream failed")


async def stream(ws: WebSocket) -> None:
    """The worker stream (docs/api/workers.md). Authenticated by the session token before the
    upgrade is accepted: a wrong or expired token gets an HTTP 401 where the server supports
    the denial-response extension (uvicorn does), else the socket is closed with 4401."""
    ctx = _ctx(ws)
    hub = hub_of(ctx)
    admission = admission_of(ctx)
    wait = admission.cooling(ws.path_params["ns"], ws.path_params["sid"])
    if wait > 0:  # closed for its budget a moment ago: refused before any database work
        admission.refused("cooling_down")
        cooling = RateLimited(
            "this session's stream was closed for exceeding its budget: reconnect after "
            "Retry-After", retry_after=math.ceil(wait), reason="cooling_down",
        )  # fmt: skip
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            await refuse(ws, cooling, error_response(cooling, request_id(ws)))
            return
        raise cooling  # closed with 4429 by the error handler
    try:
        info = await _session(ws, ws.path_params["sid"])
    except Unauthenticated as exc:
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            # A real 401 before the upgrade (ASGI WebSocket Denial Response extension).
            await refuse(ws, exc, error_response(exc, request_id(ws)))
            return
        raise  # closed with 4401 by the error handler
    queues = await sessions.resolve_queues(ctx.db, info.namespace_id, info.queues)
    # A worker that offers the batch subprotocol gets (and may send) several frames in one.
    batch = wire.BATCH_SUBPROTOCOL in ws.scope.get("subprotocols", ())
    await ws.accept(subprotocol=wire.BATCH_SUBPROTOCOL if batch else None)
    conn = WsConnection(info, queues, ws, batch=batch)
    if not await _bind(ctx, hub, conn):
        await conn.close(CLOSE_SESSION_GONE, "session_expired")
        return
    hub.notify_new_work()
    try:
        await _StreamReader(ctx, hub, conn).run()
    finally:
        await _unbind(ctx, hub, conn)


#: Refusals a worker's own frames never earn: they count against the stream's error budget.
REFUSED_FRAMES = (InvalidRequest, PayloadTooLarge, NotFound)


class _StreamReader:
    """Receives frames and answers each in its own task (at most MAX_INFLIGHT_FRAMES)."""

    def __init__(self, ctx: Any, hub: Hub, conn: WsConnection) -> None:
        self.ctx = ctx
        self.db = ctx.db
        self.hub = hub
        self.conn = conn
        self.info = conn.info
        self._slots = asyncio.Semaphore(MAX_INFLIGHT_FRAMES)
        self._tasks: set[asyncio.Task[None]] = set()
        self._token = bearer_key(conn.websocket)
        # Admission (pulse/http/admission.py): this stream's frame budget, its tenant's
        # share of the node's frame handling.
        self._admission = admission_of(ctx)
        self._budget = frame_bucket(self._admission.settings, self.info)
        self._errors = error_bucket(self._admission.settings)
        self._cooled = False
        self._tenant_slots = self._admission.tenant_slots(self.info.application_id)
        self._keyed = KeyedWaitingCheck(conn.info, conn.queues, hub.settings.keyed_check_ms)

    async def run(self) -> None:
        ws = self.conn.websocket
        try:
            while not self.conn.closed:
                try:
                    message = await ws.receive()
                except (WebSocketDisconnect, RuntimeError):
                    break
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                raw = data.encode() if data is not None else message.get("bytes") or b""
                over = False
                for frame in self._frames(raw):
                    if not self._budget.take():
                        await self._over_budget("frame_budget", None)
                        over = True
                        break
                    await self._slots.acquire()
                    await self._tenant_slots.acquire()
                    task = asyncio.create_task(self._handle(frame))
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
                if over:
                    break
        finally:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self._admission.leave(self.info.application_id)

    def _frames(self, raw: bytes) -> list[bytes]:
        """The frames of one WebSocket message: the frames of a ``batch`` frame on a stream
        that negotiated it (each then counts against the budgets and is handled as if it had
        come alone), else the message itself (a malformed batch gets its error there)."""
        if not (self.conn.batch and raw.startswith(b'{"type":"batch"')):
            return [raw]
        if len(raw) > self.ctx.settings.max_body_bytes:
            return [raw]
        try:
            check_depth(raw, self.ctx.settings.max_json_depth + 2)
            batch = wire.BATCH_DECODER.decode(raw)
        except (InvalidRequest, msgspec.ValidationError, msgspec.DecodeError):
            return [raw]
        return [bytes(f) for f in batch.frames]

    def _budget_refill(self) -> float:
        """The frames a second of this stream's budget: a cool-down lasts until one second's
        worth has refilled."""
        return float(self._budget.rate)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._tenant_slots.release()
        self._slots.release()

    async def _over_budget(self, reason: str, ref: str | None) -> None:
        """Refuse the stream's traffic: an ``error`` frame, then close 1008."""
        if reason == "frame_budget":
            self._admission.refused(reason)
            wait = self._budget.retry_after_s(self._budget_refill())
        elif reason == "error_budget":
            self._admission.refused(reason)
            wait = self._errors.retry_after_s(float(self._errors.rate))
        else:
            wait = self._admission.heartbeat_retry_s(self.info)
        if not self._cooled:  # one cool-down per stream, however many frames were refused
            self._cooled = True
            path = self.conn.websocket.path_params
            self._admission.cool_down(path["ns"], path["sid"], wait)
        await self.conn.send(
            wire.Error(
                code="rate_limited",
                message=f"the stream exceeded its {reason.replace('_', ' ')}; reconnect",
                ref_msg_id=ref,
            )
        )
        await self.conn.close(CLOSE_POLICY, reason)

    async def _handle(self, raw: bytes) -> None:
        ref: str | None = None
        frame: wire.WorkerFrame | None = None
        try:
            if len(raw) > self.ctx.settings.max_body_bytes:
                raise PayloadTooLarge("frame larger than the request size limit")
            # Depth first (linear time), so nothing below parses a hostile nesting.
            check_depth(raw, self.ctx.settings.max_json_depth)
            ref = _msg_id(raw)
            try:
                frame = wire.WORKER_DECODER.decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise InvalidRequest(f"bad frame: {exc}") from None
            reply = await self._answer(frame)
            if reply is not None:
                await self.conn.send(reply)
        except RateLimited:
            await self._over_budget("heartbeat_budget", ref)
        except SessionGone:
            await self.conn.send(
                wire.Error(
                    code="unauthenticated",
                    message="the session expired or was closed, or its credential was revoked",
                    ref_msg_id=ref,
                )
            )
            await self.conn.close(CLOSE_SESSION_GONE, "session_expired")
        except OrbitError as exc:
            if isinstance(exc, REFUSED_FRAMES) and not self._errors.take():
                await self._over_budget("error_budget", ref)
                return
            await _audit_report_failure(self.conn.websocket, self.info, frame, exc)
            await self.conn.send(_error_frame(self.ctx, exc, ref))
        except Exception as exc:
            # A storage failure as the HTTP handler renders it (a refused connection, a
            # Galera node outside the primary component, an exhausted pool: transient, the
            # SDK re-sends after Retry-After); anything else is internal.
            err = client_error(exc)
            if err is None:
                log.exception("worker frame failed")
                await self.conn.send(
                    wire.Error(code="internal", message="internal error", ref_msg_id=ref)
                )
                return
            await self.conn.send(_error_frame(self.ctx, err, ref))

    def _admit_heartbeat(self, frame: wire.Heartbeat) -> dict[str, str]:
        try:
            check_attempt_ids(self.info, frame.attempt_ids)
        except InvalidRequest:
            self._admission.refused("attempt_ids")
            raise
        self._admission.heartbeat(self.info)
        return _checked_progress(self._admission, frame.progress, frame.attempt_ids)

    async def _answer(self, frame: wire.WorkerFrame) -> wire.ServerFrame | None:
        ns, sid = self.info.namespace_id, self.info.session_id
        if isinstance(frame, wire.Start):
            reply = await _start(self.ctx, self.hub, self.conn, frame.attempt_id)
            return msgspec.structs.replace(reply, ref_msg_id=frame.msg_id)
        if isinstance(frame, wire.Heartbeat):
            progress = self._admit_heartbeat(frame)
            # The round judges the session as a new request would (credential, application,
            # expiry): a refused one ends the stream.
            try:
                result = await _batches(self.ctx).heartbeat(ns, sid, frame.attempt_ids, progress)
            except SessionGone as gone:
                if gone.credential:
                    self.ctx.metrics.counter(
                        "orbit_auth_failures_total", "Requests rejected with 401", ()
                    ).inc()
                raise
            reply_hb = msgspec.structs.replace(result.reply, ref_msg_id=frame.msg_id)
            if self._keyed.due() and (keyed := await self._keyed.queues(self.db)):
                reply_hb = msgspec.structs.replace(reply_hb, keyed_waiting=keyed)
            await self.conn.send(reply_hb)
            for attempt_hex in result.cancel_requested:
                await self.conn.send_cancel(attempt_hex, "cancel_requested")
            return None
        if isinstance(frame, wire.Complete | wire.Fail | wire.Cancelled):
            receipt = await _report(self.ctx, self.hub, ns, frame.attempt_id, frame)
            return msgspec.structs.replace(receipt, ref_msg_id=frame.msg_id)
        assert isinstance(frame, wire.Effect)
        state = await effects.effect(
            self.db, ns, _attempt_id(frame.attempt_id), frame.execution_token,
            frame.key, frame.phase, frame.result,
        )  # fmt: skip
        return msgspec.structs.replace(state, ref_msg_id=frame.msg_id)


class _Ref(msgspec.Struct):
    msg_id: str | None = None


#: Built once (a Struct class and decoder per frame cost more than the rest of the parse).
_REF_DECODER = msgspec.json.Decoder(_Ref)


def _msg_id(raw: bytes) -> str | None:
    """Best-effort ``msg_id`` of a frame that may not decode (for the error's ref)."""
    try:
        return _REF_DECODER.decode(raw).msg_id
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _error_frame(ctx: Any, exc: OrbitError, ref: str | None) -> wire.Error:
    kind = conflict_kind(exc)  # counted as the HTTP error handler counts (409, 412, 429)
    if kind is not None:
        count_conflict(ctx.metrics, kind)
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


async def _audit_report_failure(
    conn: Request | WebSocket, info: sessions.SessionInfo, frame: Any, exc: OrbitError
) -> None:
    """The audit event of a refused report or effect (409 ``stale_token``, ``conflict``…),
    with the session's credential as the actor — over the stream and the HTTP fallback."""
    action = _ATTEMPT_ACTIONS.get(type(frame))
    if action is None:
        return
    intent = AuditIntent(action, "attempt", frame.attempt_id, info.namespace_id)
    await record_failure(conn, exc, intent, Actor(info.credential_id, info.application_id))


def _attempt_id(text: str) -> bytes:
    attempt_id = parse_id(text)
    if attempt_id is None:
        raise AttemptNotFound()
    return attempt_id


def _count_start(ctx: Any, reply: wire.Started | wire.StartDenied) -> None:
    outcome = "started" if isinstance(reply, wire.Started) else reply.reason
    ctx.metrics.counter(
        "pulse_starts_total", "Start requests by outcome (started or the denial reason)",
        ("outcome",),
    ).inc(outcome=outcome)  # fmt: skip


def _count_report(ctx: Any, op: str, outcome: str) -> None:
    ctx.metrics.counter(
        "pulse_reports_total", "Result reports by operation and outcome", ("op", "outcome")
    ).inc(op=op, outcome=outcome)


async def _start(
    ctx: Any, hub: Hub, conn: Connection, attempt_hex: str
) -> wire.Started | wire.StartDenied:
    attempt_id = parse_id(attempt_hex)
    info = conn.info
    if attempt_id is None:
        return wire.StartDenied(ref_msg_id=None, attempt_id=attempt_hex, reason="not_found")
    reply = await _batches(ctx).start(info.namespace_id, info.session_id, attempt_id)
    _count_start(ctx, reply)
    if isinstance(reply, wire.Started):
        hub.track(attempt_id, conn.key)
    else:
        hub.forget(attempt_id)
        hub.notify_new_work()  # capacity freed, and the task may be back in its queue
    return reply


async def _report(
    ctx: Any, hub: Hub, namespace_id: bytes, attempt_hex: str, body: Any
) -> wire.Receipt:
    attempt_id = _attempt_id(attempt_hex)
    rep = attempts.Report.from_frame(body, attempt_id)
    try:
        receipt = await _batches(ctx).report(namespace_id, rep)
    except OrbitError as exc:
        _count_report(ctx, rep.op, exc.code)
        raise
    _count_report(ctx, rep.op, receipt.outcome)
    hub.forget(attempt_id)
    hub.notify_new_work()  # capacity freed (and a retried task may be due)
    return receipt


# -- HTTP fallback ---------------------------------------------------------------------------


@api(
    "Long-poll offers for a session",
    responses={200: wire.PollReply},
    errors=(401,),
    query=[QueryParam("wait_ms", int, "longest wait (capped by the server)")],
    tags=["workers"],
)
async def poll(request: Request) -> Response:
    ctx = _ctx(request)
    hub = hub_of(ctx)
    info = await _session(request, request.path_params["sid"])
    wait_ms = min(
        query_int(request, "wait_ms", DEFAULT_POLL_WAIT_MS), hub.settings.poll_max_wait_ms
    )
    conn = hub.get(info.namespace_id, info.session_id)
    if not isinstance(conn, PollConnection) or conn.closed:
        queues = await sessions.resolve_queues(ctx.db, info.namespace_id, info.queues)
        conn = PollConnection(info, queues)
        if not await _bind(ctx, hub, conn):
            raise SessionGone()
    await _dispatcher(ctx, hub).dispatch_to(conn)
    offers = await conn.wait(wait_ms / 1000)
    return json_response(wire.PollReply(offers=offers))


@api(
    "Session keep-alive (and heartbeat of the listed attempts)",
    body=wire.SessionHeartbeatBody,
    responses={200: wire.HeartbeatOk},
    errors=(400, 401),
    tags=["workers"],
)
async def session_heartbeat(request: Request) -> Response:
    ctx = _ctx(request)
    info = await _session(request, request.path_params["sid"])
    body = decode_optional(
        await request.body(), wire.SessionHeartbeatBody, wire.SessionHeartbeatBody(),
        max_depth=_max_depth(request),
    )  # fmt: skip
    return await _heartbeat(ctx, info, body.attempt_ids, body.progress)


def _checked_progress(
    admission: Any, progress: dict[str, msgspec.Raw] | None, attempt_ids: list[str]
) -> dict[str, str]:
    try:
        return check_progress(progress, attempt_ids)
    except InvalidRequest:
        admission.refused("progress")
        raise


async def _heartbeat(
    ctx: Any,
    info: sessions.SessionInfo,
    attempt_ids: list[str],
    progress: dict[str, msgspec.Raw] | None = None,
) -> Response:
    admission = admission_of(ctx)
    try:
        check_attempt_ids(info, attempt_ids)
    except InvalidRequest:
        admission.refused("attempt_ids")
        raise
    admission.heartbeat(info)  # 429 rate_limited past the session's heartbeat budget
    checked = _checked_progress(admission, progress, attempt_ids)
    result = await _batches(ctx).heartbeat(info.namespace_id, info.session_id, attempt_ids, checked)
    return json_response(result.reply)


@api("Start an offered attempt", responses={200: wire.Started}, errors=(401, 404), tags=["workers"])
async def attempt_start(request: Request) -> Response:
    ctx = _ctx(request)
    info = await _session(request)
    attempt_id = _attempt_id(request.path_params["aid"])
    reply = await _batches(ctx).start(info.namespace_id, info.session_id, attempt_id)
    _count_start(ctx, reply)
    hub = hub_of(ctx)
    if isinstance(reply, wire.StartDenied):
        if reply.reason == attempts.DENY_NOT_FOUND:
            raise AttemptNotFound()
        hub.notify_new_work()
    return json_response(reply)


@api(
    "Heartbeat one attempt (optionally with its progress)", body=wire.AttemptHeartbeatBody,
    responses={200: wire.HeartbeatOk}, errors=(400, 401), tags=["workers"],
)  # fmt: skip
async def attempt_heartbeat(request: Request) -> Response:
    ctx = _ctx(request)
    info = await _session(request)
    body = decode_optional(
        await request.body(), wire.AttemptHeartbeatBody, wire.AttemptHeartbeatBody(),
        max_depth=_max_depth(request),
    )  # fmt: skip
    aid = request.path_params["aid"]
    progress = None if bytes(body.progress).strip() == b"null" else {aid: body.progress}
    return await _heartbeat(ctx, info, [aid], progress)


async def _http_report(request: Request, body_type: type[Any]) -> Response:
    ctx = _ctx(request)
    # A report is bound to its attempt by the execution token, not to a session: the
    # session token only says which worker is talking, so an ended session's token is
    # accepted here (a late report is then kept as evidence, docs/api/workers.md).
    info = await _session(request, allow_ended=True)
    attempt_hex = request.path_params["aid"]
    body = decode(await request.body(), body_type, max_depth=_max_depth(request))
    frame: wire.Complete | wire.Fail | wire.Cancelled
    if isinstance(body, wire.CompleteBody):
        frame = wire.Complete(
            msg_id="http", attempt_id=attempt_hex, execution_token=body.execution_token,
            result=body.result,
        )  # fmt: skip
    elif isinstance(body, wire.FailBody):
        frame = wire.Fail(
            msg_id="http", attempt_id=attempt_hex, execution_token=body.execution_token,
            error=body.error, retryable=body.retryable, retry_after_ms=body.retry_after_ms,
        )  # fmt: skip
    else:
        frame = wire.Cancelled(
            msg_id="http", attempt_id=attempt_hex, execution_token=body.execution_token
        )
    try:
        receipt = await _report(ctx, hub_of(ctx), info.namespace_id, attempt_hex, frame)
    except OrbitError as exc:
        await _audit_report_failure(request, info, frame, exc)
        raise
    return json_response(receipt)


@api(
    "Report success",
    body=wire.CompleteBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_complete(request: Request) -> Response:
    return await _http_report(request, wire.CompleteBody)


@api(
    "Report failure",
    body=wire.FailBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_fail(request: Request) -> Response:
    return await _http_report(request, wire.FailBody)


@api(
    "Report that a cancelled attempt stopped",
    body=wire.CancelledBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_cancelled(request: Request) -> Response:
    return await _http_report(request, wire.CancelledBody)


@api(
    "Side-effect ledger: begin or commit an effect",
    body=wire.EffectBody,
    responses={200: wire.EffectState},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_effect(request: Request) -> Response:
    ctx = _ctx(request)
    info = await _session(request, allow_ended=True)  # fenced by the token, like reports
    body = decode(await request.body(), wire.EffectBody, max_depth=_max_depth(request))
    try:
        state = await effects.effect(
            ctx.db, info.namespace_id, _attempt_id(request.path_params["aid"]),
            body.execution_token, body.key, body.phase, body.result,
        )  # fmt: skip
    except OrbitError as exc:
        frame = wire.Effect(
            msg_id="http", attempt_id=request.path_params["aid"],
            execution_token=body.execution_token, key=body.key, phase=body.phase,
        )  # fmt: skip
        await _audit_report_failure(request, info, frame, exc)
        raise
    return json_response(state)


def routes() -> list[BaseRoute]:
    """Every worker route, to mount at the application root."""
    base = "/v1/namespaces/{ns}"
    sessions_base = f"{base}/workers/sessions"
    attempt = f"{base}/attempts/{{aid}}"
    return [
        Route(sessions_base, create_session, methods=["POST"]),
        Route(f"{sessions_base}/{{sid}}", close_session, methods=["DELETE"]),
        WebSocketRoute(f"{sessions_base}/{{sid}}/stream", stream),
        Route(f"{sessions_base}/{{sid}}/poll", poll, methods=["POST"]),
        Route(f"{sessions_base}/{{sid}}/heartbeat", session_heartbeat, methods=["POST"]),
        Route(f"{attempt}/start", attempt_start, methods=["POST"]),
        Route(f"{attempt}/heartbeat", attempt_heartbeat, methods=["POST"]),
        Route(f"{attempt}/complete", attempt_complete, methods=["POST"]),
        Route(f"{attempt}/fail", attempt_fail, methods=["POST"]),
        Route(f"{attempt}/cancelled", attempt_cancelled, methods=["POST"]),
        Route(f"{attempt}/effect", attempt_effect, methods=["POST"]),
    ]


ROUTES = routes()

__all__ = ["ROUTES", "routes"]
