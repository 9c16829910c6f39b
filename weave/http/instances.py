"""Workflow instance routes (docs/api/workflows.md: instances, signals, control).

| method | path | action |
| --- | --- | --- |
| POST | /v1/namespaces/{ns}/workflows/{name}/instances | workflows.manage (201 new, 200 by business key) |
| GET | /v1/namespaces/{ns}/instances/{id} | workflows.manage or tasks.read |
| GET | /v1/namespaces/{ns}/instances/{id}/history | workflows.manage or tasks.read |
| GET | /v1/namespaces/{ns}/instances | workflows.manage or tasks.read (list; additive) |
| POST | /v1/namespaces/{ns}/instances/{id}/signals/{signal} | workflows.signal (201 new, 200 duplicate) |
| POST | /v1/namespaces/{ns}/instances/{id}/pause, /resume, /cancel | workflows.manage |

Instance responses carry ``ETag: "<control_revision>"``; control requests honour
``If-Match`` against it.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from orbit.context import AppContext
from orbit.errors import InvalidRequest
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import Principal, authenticated, authorize
from orbit.http.body import decode_body, decode_optional, read_body
from orbit.http.etag import preconditions
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.ids import id_hex
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.types import Action, check_name
from weave import instances, signals
from weave.types import HistoryOut, InstanceOut, InstancePage, SignalBody, SignalOut, StartBody

if TYPE_CHECKING:
    from weave.runtime import WeaveRuntime

TAGS = ["workflows"]
MANAGE = Action.WORKFLOWS_MANAGE.value
SIGNAL = Action.WORKFLOWS_SIGNAL.value
READ = Action.TASKS_READ.value
STATES = ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
#: Most entries of one page of an instance's history.
HISTORY_MAX_LIMIT = 5000


class CancelBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Optional body of ``POST .../cancel``."""

    reason: Annotated[str, Meta(min_length=1, max_length=500)] = "cancelled on request"


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def _ns(principal: Principal) -> bytes:
    assert principal.namespace_id is not None
    return principal.namespace_id


async def _authorize_read(request: Request) -> Principal:
    """Reads need ``workflows.manage`` or ``tasks.read`` (either suffices)."""
    who = await authenticated(request)
    action = MANAGE if who.may(MANAGE) or not who.may(READ) else READ
    return await authorize(request, action, request.path_params["ns"])


async def _check_visible(request: Request, principal: Principal) -> None:
    """404 for an instance whose steps run on queues a queue-limited key may not use."""
    await instances.check_visible(
        _ctx(request).db, _ns(principal), request.path_params["id"], principal.queues
    )


def _instance_response(out: InstanceOut, status: int = 200) -> Response:
    return json_response(out, status, headers={"ETag": f'"{out.control_revision}"'})


@api(
    "Start a workflow instance (idempotent by business_key or Idempotency-Key)",
    body=StartBody, responses={201: InstanceOut, 200: InstanceOut},
    errors=[400, 404, 409, 422, 429], action=MANAGE, idempotent=True, tags=TAGS,
)  # fmt: skip
async def start_instance(rt: WeaveRuntime, request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    name = check_name(request.path_params["name"], "name")
    body = await decode_body(request, StartBody)
    ns_id = _ns(principal)
    audit_intent(request, instances.START, "workflow", name, ns_id)
    reply = await instances.start_instance(
        _ctx(request).db, principal.actor, ns_id, name, body, hub=rt.pulse.hub,
        allowed_queues=principal.queues, request_id=request_id(request),
        idem=await idem_request(request),
    )  # fmt: skip
    return reply_response(reply)


@api(
    "Read an instance: state, paused, steps, output",
    responses={200: InstanceOut}, errors=[404], action=f"{MANAGE} | {READ}", tags=TAGS,
)  # fmt: skip
async def get_instance(request: Request) -> Response:
    principal = await _authorize_read(request)
    await _check_visible(request, principal)
    out = await instances.get_instance(_ctx(request).db, _ns(principal), request.path_params["id"])
    return _instance_response(out)


@api(
    "Read an instance's history: steps, activations and waits in order, transitions, signals",
    responses={200: HistoryOut}, errors=[400, 404], action=f"{MANAGE} | {READ}",
    query=(QueryParam("limit", Annotated[int, Meta(ge=1, le=HISTORY_MAX_LIMIT)],
                      "entries per page, 1-5000 (default 500)"),
           QueryParam("cursor", str, "next_cursor of the previous page")),
    tags=TAGS,
)  # fmt: skip
async def get_history(request: Request) -> Response:
    principal = await _authorize_read(request)
    await _check_visible(request, principal)
    instance_id = request.path_params["id"]
    limit = parse_limit(request.query_params.get("limit"), default=500, maximum=HISTORY_MAX_LIMIT)
    position = decode_cursor(request.query_params.get("cursor"), {"instance": instance_id})
    after = position.get("after_seq", 0) if position else 0
    out = await instances.get_history(
        _ctx(request).db, _ns(principal), instance_id,
        after_seq=after if isinstance(after, int) else 0, limit=limit,
    )  # fmt: skip
    return json_response(out)


@api(
    "List instances, newest first (filters: workflow, state)",
    responses={200: InstancePage}, errors=[400, 404], action=f"{MANAGE} | {READ}",
    query=(QueryParam("workflow", str, "workflow name"), QueryParam("state", str, ", ".join(STATES), enum=STATES),
           QueryParam("limit", int, "page size, 1-500"), QueryParam("cursor", str, "")),
    tags=TAGS,
)  # fmt: skip
async def list_instances(request: Request) -> Response:
    principal = await _authorize_read(request)
    q = request.query_params
    workflow, state = q.get("workflow"), q.get("state")
    if state is not None and state not in STATES:
        raise InvalidRequest(f"state must be one of {', '.join(STATES)}", field="state")
    filters = {"workflow": workflow, "state": state}
    limit = parse_limit(q.get("limit"))
    position = decode_cursor(q.get("cursor"), filters)
    before = None
    if position is not None:
        try:
            before = (datetime.fromisoformat(position["at"]), bytes.fromhex(position["id"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest("cursor is not valid", field="cursor") from None
    items, nxt = await instances.list_instances(
        _ctx(request).db, _ns(principal), workflow=workflow, state=state, before=before,
        limit=limit, allowed_queues=principal.queues,
    )  # fmt: skip
    cursor = (
        encode_cursor({"at": nxt[0].isoformat(), "id": id_hex(nxt[1])}, filters) if nxt else None
    )
    return json_response(InstancePage(items, cursor))


@api(
    "Send a signal to an instance (de-duplicated by signal_id)",
    body=SignalBody, responses={201: SignalOut, 200: SignalOut}, errors=[400, 404, 409, 422],
    action=SIGNAL, idempotent=True, tags=TAGS,
)  # fmt: skip
async def send_signal(rt: WeaveRuntime, request: Request) -> Response:
    principal = await authorize(request, SIGNAL, request.path_params["ns"])
    name = check_name(request.path_params["signal"], "signal")
    body = await decode_body(request, SignalBody)
    ns_id = _ns(principal)
    audit_intent(request, signals.SIGNAL, "workflow_instance", request.path_params["id"], ns_id)
    await _check_visible(request, principal)
    reply = await signals.send_signal(
        _ctx(request).db, ns_id, request.path_params["id"], name, body, actor=principal.actor,
        request_id=request_id(request), idem=await idem_request(request),
    )  # fmt: skip
    if reply.status == 201 and not reply.replayed:
        rt.advancer.wake()
    return reply_response(reply)


async def _control(rt: WeaveRuntime, request: Request, what: str) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    ns_id = _ns(principal)
    instance_id = request.path_params["id"]
    action = {"pause": instances.PAUSE, "resume": instances.RESUME, "cancel": instances.CANCEL}[
        what
    ]
    audit_intent(request, action, "workflow_instance", instance_id, ns_id)
    await _check_visible(request, principal)
    common: dict[str, Any] = {
        "actor": principal.actor,
        "preconditions": preconditions(request),
        "request_id": request_id(request),
    }
    db = _ctx(request).db
    if what == "pause":
        await read_body(request)
        out = await instances.pause_instance(db, ns_id, instance_id, **common)
    elif what == "resume":
        await read_body(request)
        out = await instances.resume_instance(db, ns_id, instance_id, hub=rt.pulse.hub, **common)
    else:
        body = decode_optional(await read_body(request), CancelBody, CancelBody())
        out = await instances.cancel_instance(
            db, ns_id, instance_id, hub=rt.pulse.hub, reason=body.reason, **common
        )
    return _instance_response(out)


@api(
    "Pause an instance (events meanwhile become pending advances)",
    responses={200: InstanceOut}, errors=[404, 409, 412], action=MANAGE, etag=True, tags=TAGS,
)  # fmt: skip
async def pause_instance(rt: WeaveRuntime, request: Request) -> Response:
    return await _control(rt, request, "pause")


@api(
    "Resume a paused instance (applies its pending advances in order)",
    responses={200: InstanceOut}, errors=[404, 409, 412], action=MANAGE, etag=True, tags=TAGS,
)  # fmt: skip
async def resume_instance(rt: WeaveRuntime, request: Request) -> Response:
    return await _control(rt, request, "resume")


@api(
    "Cancel an instance and its running tasks",
    body=CancelBody, responses={200: InstanceOut}, errors=[404, 409, 412], action=MANAGE,
    etag=True, tags=TAGS,
)  # fmt: skip
async def cancel_instance(rt: WeaveRuntime, request: Request) -> Response:
    return await _control(rt, request, "cancel")


def routes(rt: WeaveRuntime) -> list[BaseRoute]:
    base = "/v1/namespaces/{ns}/instances"
    return [
        Route(
            "/v1/namespaces/{ns}/workflows/{name}/instances",
            partial(start_instance, rt),
            methods=["POST"],
        ),
        Route(base, list_instances, methods=["GET"]),
        Route(f"{base}/{{id}}", get_instance, methods=["GET"]),
        Route(f"{base}/{{id}}/history", get_history, methods=["GET"]),
        Route(f"{base}/{{id}}/signals/{{signal}}", partial(send_signal, rt), methods=["POST"]),
        Route(f"{base}/{{id}}/pause", partial(pause_instance, rt), methods=["POST"]),
        Route(f"{base}/{{id}}/resume", partial(resume_instance, rt), methods=["POST"]),
        Route(f"{base}/{{id}}/cancel", partial(cancel_instance, rt), methods=["POST"]),
    ]
