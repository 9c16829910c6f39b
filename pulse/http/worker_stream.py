"""The worker stream: ``GET /v1/namespaces/{ns}/workers/sessions/{sid}/stream`` (WebSocket,
session token), message by message in docs/api/workers.md. Each frame is answered in its own
task (at most :data:`MAX_INFLIGHT_FRAMES` per stream), within the stream's frame, error and
heartbeat budgets and its tenant's share of the node (:mod:`pulse.http.admission`)."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from orbit.errors import (
    InvalidRequest,
    NotFound,
    OrbitError,
    PayloadTooLarge,
    RateLimited,
    Unauthenticated,
)
from orbit.http.auditing import request_id
from orbit.http.auth import bearer_key
from orbit.http.body import check_depth
from orbit.http.errors import client_error, error_response
from orbit.http.ws_refusal import refuse
from pulse import effects, sessions, wire
from pulse.errors import SessionGone
from pulse.http.admission import CLOSE_POLICY, check_attempt_ids, error_bucket, frame_bucket
from pulse.http.worker_common import (
    attempt_id_of,
    audit_report_failure,
    bind,
    checked_progress,
    count_auth_failure,
    error_frame,
    report_attempt,
    session_of,
    start_attempt,
    unbind,
)
from pulse.hub import CLOSE_SESSION_GONE, WsConnection
from pulse.keyed_waiting import KeyedWaitingCheck

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

log = logging.getLogger("pulse.http.workers")

#: Frames of one stream handled at the same time (the rest wait: backpressure).
MAX_INFLIGHT_FRAMES = 32


async def stream(rt: PulseRuntime, ws: WebSocket) -> None:
    """The worker stream (docs/api/workers.md). Authenticated by the session token before the
    upgrade is accepted: a wrong or expired token gets an HTTP 401 where the server supports
    the denial-response extension (uvicorn does), else the socket is closed with 4401."""
    admission = rt.admission
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
        info = await session_of(rt, ws, ws.path_params["sid"])
    except Unauthenticated as exc:
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            # A real 401 before the upgrade (ASGI WebSocket Denial Response extension).
            await refuse(ws, exc, error_response(exc, request_id(ws)))
            return
        raise  # closed with 4401 by the error handler
    queues = await sessions.resolve_queues(rt.db, info.namespace_id, info.queues)
    # A worker that offers the batch subprotocol gets (and may send) several frames in one.
    batch = wire.BATCH_SUBPROTOCOL in ws.scope.get("subprotocols", ())
    await ws.accept(subprotocol=wire.BATCH_SUBPROTOCOL if batch else None)
    conn = WsConnection(info, queues, ws, batch=batch)
    if not await bind(rt, conn):
        await conn.close(CLOSE_SESSION_GONE, "session_expired")
        return
    rt.hub.notify_new_work()
    try:
        await _StreamReader(rt, conn).run()
    finally:
        await unbind(rt, conn)


#: Refusals a worker's own frames never earn: they count against the stream's error budget.
REFUSED_FRAMES = (InvalidRequest, PayloadTooLarge, NotFound)


class _StreamReader:
    """Receives frames and answers each in its own task (at most MAX_INFLIGHT_FRAMES)."""

    def __init__(self, rt: PulseRuntime, conn: WsConnection) -> None:
        self.rt = rt
        self.db = rt.db
        self.conn = conn
        self.info = conn.info
        self._slots = asyncio.Semaphore(MAX_INFLIGHT_FRAMES)
        self._tasks: set[asyncio.Task[None]] = set()
        self._token = bearer_key(conn.websocket)
        # Admission (pulse/http/admission.py): this stream's frame budget, its tenant's
        # share of the node's frame handling.
        self._admission = rt.admission
        self._budget = frame_bucket(self._admission.settings, self.info)
        self._errors = error_bucket(self._admission.settings)
        self._cooled = False
        self._tenant_slots = self._admission.tenant_slots(self.info.application_id)
        self._keyed = KeyedWaitingCheck(conn.info, conn.queues, rt.hub.settings.keyed_check_ms)

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
        if len(raw) > self.rt.settings.max_body_bytes:
            return [raw]
        try:
            check_depth(raw, self.rt.settings.max_json_depth + 2)
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
            if len(raw) > self.rt.settings.max_body_bytes:
                raise PayloadTooLarge("frame larger than the request size limit")
            # Depth first (linear time), so nothing below parses a hostile nesting.
            check_depth(raw, self.rt.settings.max_json_depth)
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
            await audit_report_failure(self.conn.websocket, self.info, frame, exc)
            await self.conn.send(error_frame(self.rt, exc, ref))
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
            await self.conn.send(error_frame(self.rt, err, ref))

    def _admit_heartbeat(self, frame: wire.Heartbeat) -> dict[str, str]:
        try:
            check_attempt_ids(self.info, frame.attempt_ids)
        except InvalidRequest:
            self._admission.refused("attempt_ids")
            raise
        self._admission.heartbeat(self.info)
        return checked_progress(self._admission, frame.progress, frame.attempt_ids)

    async def _answer(self, frame: wire.WorkerFrame) -> wire.ServerFrame | None:
        ns, sid = self.info.namespace_id, self.info.session_id
        if isinstance(frame, wire.Start):
            reply = await start_attempt(self.rt, self.conn, frame.attempt_id)
            return msgspec.structs.replace(reply, ref_msg_id=frame.msg_id)
        if isinstance(frame, wire.Heartbeat):
            progress = self._admit_heartbeat(frame)
            # The round judges the session as a new request would (credential, application,
            # expiry): a refused one ends the stream.
            try:
                result = await self.rt.batches.heartbeat(
                    ns, sid, frame.attempt_ids, progress, heartbeat_ms=self.info.heartbeat_ms
                )
            except SessionGone as gone:
                if gone.credential:
                    count_auth_failure(self.rt)
                raise
            reply_hb = msgspec.structs.replace(result.reply, ref_msg_id=frame.msg_id)
            if self._keyed.due() and (keyed := await self._keyed.queues(self.db)):
                reply_hb = msgspec.structs.replace(reply_hb, keyed_waiting=keyed)
            await self.conn.send(reply_hb)
            for attempt_hex in result.cancel_requested:
                await self.conn.send_cancel(attempt_hex, "cancel_requested")
            return None
        if isinstance(frame, wire.Complete | wire.Fail | wire.Cancelled):
            receipt = await report_attempt(self.rt, ns, frame.attempt_id, frame)
            return msgspec.structs.replace(receipt, ref_msg_id=frame.msg_id)
        assert isinstance(frame, wire.Effect)
        state = await effects.effect(
            self.db, ns, attempt_id_of(frame.attempt_id), frame.execution_token,
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
