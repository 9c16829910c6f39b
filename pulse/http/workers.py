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

from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from orbit.errors import InvalidRequest, OrbitError
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.body import decode, decode_optional, query_int
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from pulse import attempts, effects, sessions, wire
from pulse.errors import AttemptNotFound, SessionGone
from pulse.http.admission import check_attempt_ids
from pulse.http.worker_common import (
    attempt_id_of,
    audit_report_failure,
    bind,
    checked_progress,
    count_start,
    report_attempt,
    session_of,
)
from pulse.http.worker_stream import stream
from pulse.hub import CLOSE_SESSION_GONE, PollConnection

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

CONNECT = "workers.connect"
DEFAULT_POLL_WAIT_MS = 10_000


def _max_depth(rt: PulseRuntime) -> int:
    return rt.settings.max_json_depth


# -- session creation ------------------------------------------------------------------------


@api(
    "Open a worker session (returns the session token once)",
    body=wire.SessionCreate,
    responses={201: wire.SessionCreated},
    errors=(400, 401, 403, 404, 409),
    action=CONNECT,
    tags=["workers"],
)
async def create_session(rt: PulseRuntime, request: Request) -> Response:
    ns = request.path_params["ns"]
    p = await authorize(request, CONNECT, ns)
    assert p.namespace_id is not None
    audit_intent(request, CONNECT, "worker_session", None, p.namespace_id)
    body = decode(await request.body(), wire.SessionCreate, max_depth=_max_depth(rt))
    created = await sessions.create_session(
        rt.db,
        namespace_id=p.namespace_id,
        application_id=p.application_id,
        credential_id=p.credential_id,
        allowed_queues=p.queues,
        body=body,
        settings=rt.hub.settings,
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
async def close_session(rt: PulseRuntime, request: Request) -> Response:
    """``DELETE /v1/namespaces/{ns}/workers/sessions/{sid}`` with the session token. Closing
    an already closed or expired session answers 200 with its state (a re-sent close)."""
    hub = rt.hub
    info = await session_of(rt, request, request.path_params["sid"], allow_ended=True)
    answer, ended = await sessions.close_session(rt.db, info.namespace_id, info.session_id)
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


# -- HTTP fallback ---------------------------------------------------------------------------


@api(
    "Long-poll offers for a session",
    responses={200: wire.PollReply},
    errors=(401,),
    query=[QueryParam("wait_ms", int, "longest wait (capped by the server)")],
    tags=["workers"],
)
async def poll(rt: PulseRuntime, request: Request) -> Response:
    hub = rt.hub
    info = await session_of(rt, request, request.path_params["sid"])
    wait_ms = min(
        query_int(request, "wait_ms", DEFAULT_POLL_WAIT_MS), hub.settings.poll_max_wait_ms
    )
    conn = hub.get(info.namespace_id, info.session_id)
    if not isinstance(conn, PollConnection) or conn.closed:
        queues = await sessions.resolve_queues(rt.db, info.namespace_id, info.queues)
        conn = PollConnection(info, queues)
        if not await bind(rt, conn):
            raise SessionGone()
    await rt.dispatcher.dispatch_to(conn)
    offers = await conn.wait(wait_ms / 1000)
    return json_response(wire.PollReply(offers=offers))


@api(
    "Session keep-alive (and heartbeat of the listed attempts)",
    body=wire.SessionHeartbeatBody,
    responses={200: wire.HeartbeatOk},
    errors=(400, 401),
    tags=["workers"],
)
async def session_heartbeat(rt: PulseRuntime, request: Request) -> Response:
    info = await session_of(rt, request, request.path_params["sid"])
    body = decode_optional(
        await request.body(), wire.SessionHeartbeatBody, wire.SessionHeartbeatBody(),
        max_depth=_max_depth(rt),
    )  # fmt: skip
    return await _heartbeat(rt, info, body.attempt_ids, body.progress)


async def _heartbeat(
    rt: PulseRuntime,
    info: sessions.SessionInfo,
    attempt_ids: list[str],
    progress: dict[str, msgspec.Raw] | None = None,
) -> Response:
    admission = rt.admission
    try:
        check_attempt_ids(info, attempt_ids)
    except InvalidRequest:
        admission.refused("attempt_ids")
        raise
    admission.heartbeat(info)  # 429 rate_limited past the session's heartbeat budget
    checked = checked_progress(admission, progress, attempt_ids)
    result = await rt.batches.heartbeat(info.namespace_id, info.session_id, attempt_ids, checked)
    return json_response(result.reply)


@api("Start an offered attempt", responses={200: wire.Started}, errors=(401, 404), tags=["workers"])
async def attempt_start(rt: PulseRuntime, request: Request) -> Response:
    info = await session_of(rt, request)
    attempt_id = attempt_id_of(request.path_params["aid"])
    reply = await rt.batches.start(info.namespace_id, info.session_id, attempt_id)
    count_start(rt, reply)
    hub = rt.hub
    if isinstance(reply, wire.StartDenied):
        if reply.reason == attempts.DENY_NOT_FOUND:
            raise AttemptNotFound()
        hub.notify_new_work()
    return json_response(reply)


@api(
    "Heartbeat one attempt (optionally with its progress)", body=wire.AttemptHeartbeatBody,
    responses={200: wire.HeartbeatOk}, errors=(400, 401), tags=["workers"],
)  # fmt: skip
async def attempt_heartbeat(rt: PulseRuntime, request: Request) -> Response:
    info = await session_of(rt, request)
    body = decode_optional(
        await request.body(), wire.AttemptHeartbeatBody, wire.AttemptHeartbeatBody(),
        max_depth=_max_depth(rt),
    )  # fmt: skip
    aid = request.path_params["aid"]
    progress = None if bytes(body.progress).strip() == b"null" else {aid: body.progress}
    return await _heartbeat(rt, info, [aid], progress)


async def _http_report(rt: PulseRuntime, request: Request, body_type: type[Any]) -> Response:
    # A report is bound to its attempt by the execution token, not to a session: the
    # session token only says which worker is talking, so an ended session's token is
    # accepted here (a late report is then kept as evidence, docs/api/workers.md).
    info = await session_of(rt, request, allow_ended=True)
    attempt_hex = request.path_params["aid"]
    body = decode(await request.body(), body_type, max_depth=_max_depth(rt))
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
        receipt = await report_attempt(rt, info.namespace_id, attempt_hex, frame)
    except OrbitError as exc:
        await audit_report_failure(request, info, frame, exc)
        raise
    return json_response(receipt)


@api(
    "Report success",
    body=wire.CompleteBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_complete(rt: PulseRuntime, request: Request) -> Response:
    return await _http_report(rt, request, wire.CompleteBody)


@api(
    "Report failure",
    body=wire.FailBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_fail(rt: PulseRuntime, request: Request) -> Response:
    return await _http_report(rt, request, wire.FailBody)


@api(
    "Report that a cancelled attempt stopped",
    body=wire.CancelledBody,
    responses={200: wire.Receipt},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_cancelled(rt: PulseRuntime, request: Request) -> Response:
    return await _http_report(rt, request, wire.CancelledBody)


@api(
    "Side-effect ledger: begin or commit an effect",
    body=wire.EffectBody,
    responses={200: wire.EffectState},
    errors=(400, 401, 404, 409),
    tags=["workers"],
)
async def attempt_effect(rt: PulseRuntime, request: Request) -> Response:
    info = await session_of(rt, request, allow_ended=True)  # fenced by the token, like reports
    body = decode(await request.body(), wire.EffectBody, max_depth=_max_depth(rt))
    try:
        state = await effects.effect(
            rt.db, info.namespace_id, attempt_id_of(request.path_params["aid"]),
            body.execution_token, body.key, body.phase, body.result,
        )  # fmt: skip
    except OrbitError as exc:
        frame = wire.Effect(
            msg_id="http", attempt_id=request.path_params["aid"],
            execution_token=body.execution_token, key=body.key, phase=body.phase,
        )  # fmt: skip
        await audit_report_failure(request, info, frame, exc)
        raise
    return json_response(state)


def routes(rt: PulseRuntime) -> list[BaseRoute]:
    """Every worker route, to mount at the application root, bound to ``rt``."""
    base = "/v1/namespaces/{ns}"
    sessions_base = f"{base}/workers/sessions"
    attempt = f"{base}/attempts/{{aid}}"
    return [
        Route(sessions_base, partial(create_session, rt), methods=["POST"]),
        Route(f"{sessions_base}/{{sid}}", partial(close_session, rt), methods=["DELETE"]),
        WebSocketRoute(f"{sessions_base}/{{sid}}/stream", partial(stream, rt)),
        Route(f"{sessions_base}/{{sid}}/poll", partial(poll, rt), methods=["POST"]),
        Route(
            f"{sessions_base}/{{sid}}/heartbeat", partial(session_heartbeat, rt), methods=["POST"]
        ),
        Route(f"{attempt}/start", partial(attempt_start, rt), methods=["POST"]),
        Route(f"{attempt}/heartbeat", partial(attempt_heartbeat, rt), methods=["POST"]),
        Route(f"{attempt}/complete", partial(attempt_complete, rt), methods=["POST"]),
        Route(f"{attempt}/fail", partial(attempt_fail, rt), methods=["POST"]),
        Route(f"{attempt}/cancelled", partial(attempt_cancelled, rt), methods=["POST"]),
        Route(f"{attempt}/effect", partial(attempt_effect, rt), methods=["POST"]),
    ]


__all__ = ["routes"]
