"""Queue and gate routes (docs/api/queues.md), action ``queues.manage``.

| method | path | answer |
| --- | --- | --- |
| PUT | ``/v1/namespaces/{ns}/queues/{queue}`` | 201 created / 200 updated (or no-op); ``ETag`` |
| GET | ``/v1/namespaces/{ns}/queues/{queue}`` | config, gate, counts by state, usage (with ``stuck_tasks``); ``ETag`` |
| GET | ``/v1/namespaces/{ns}/queues`` | ``{"items", "next_cursor"}`` by name |
| POST | ``/v1/namespaces/{ns}/queues/{queue}/pause`` / ``resume`` | queue gate; idempotent |
| POST | ``/v1/namespaces/{ns}/pause`` / ``resume`` | namespace gate (additive); idempotent |
| GET | ``/v1/namespaces/{ns}/gate`` | the namespace gate (additive) |
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.context import AppContext
from orbit.errors import Forbidden
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.body import decode_optional, read_body
from orbit.http.etag import etag, preconditions
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import parse_limit
from orbit.types import Action, check_name
from pulse import queues as service
from pulse.types import QueuePut

ACTION = Action.QUEUES_MANAGE.value
TAGS = ["queues"]


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def _queue_response(view: dict[str, Any], status: int = 200) -> Response:
    return json_response(view, status, headers={"ETag": etag(int(view["revision"]))})


@api(
    "Create or replace a queue's configuration", body=QueuePut, responses={201: None, 200: None},
    errors=[400, 404, 412], action=ACTION, etag=True, tags=TAGS,
)  # fmt: skip
async def put_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    principal = await authorize(request, ACTION, request.path_params["ns"], queue=name)
    assert principal.namespace_id is not None
    check_name(name, "queue")
    audit_intent(request, "queues.put", "queue", name, principal.namespace_id)
    ctx = _ctx(request)
    body = decode_optional(
        await read_body(request), QueuePut, QueuePut(), max_depth=ctx.settings.max_json_depth
    )
    res = await service.put_queue(
        ctx.db,
        principal.namespace_id,
        name,
        body,
        pre=preconditions(request),
        actor=principal.actor,
        request_id=request_id(request),
    )
    return _queue_response(res.queue, 201 if res.created else 200)


@api(
    "A queue: configuration, gate, live counts by state, usage counters",
    errors=[404], action=ACTION, etag=True, tags=TAGS,
)  # fmt: skip
async def get_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    principal = await authorize(request, ACTION, request.path_params["ns"], queue=name)
    assert principal.namespace_id is not None
    view = await service.get_queue(_ctx(request).db, principal.namespace_id, name)
    return _queue_response(view)


@api(
    "Queues of the namespace by name", errors=[400, 404], action=ACTION, tags=TAGS,
    query=(
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_queues(request: Request) -> Response:
    principal = await authorize(request, ACTION, request.path_params["ns"])
    assert principal.namespace_id is not None
    page = await service.list_queues(
        _ctx(request).db,
        principal.namespace_id,
        limit=parse_limit(request.query_params.get("limit")),
        cursor=request.query_params.get("cursor"),
    )
    if principal.queues is not None:  # a key limited to some queues sees only those
        page["items"] = [q for q in page["items"] if q["name"] in principal.queues]
    return json_response(page)


async def _queue_gate(request: Request, paused: bool) -> Response:
    name = request.path_params["queue"]
    principal = await authorize(request, ACTION, request.path_params["ns"], queue=name)
    assert principal.namespace_id is not None
    audit_intent(
        request, "queues.pause" if paused else "queues.resume", "queue", name,
        principal.namespace_id,
    )  # fmt: skip
    view = await service.set_queue_paused(
        _ctx(request).db,
        principal.namespace_id,
        name,
        paused,
        actor=principal.actor,
        request_id=request_id(request),
    )
    return _queue_response(view)


@api("Pause a queue's gate (no new starts)", errors=[404], action=ACTION, tags=TAGS)
async def pause_queue(request: Request) -> Response:
    return await _queue_gate(request, True)


@api("Resume a queue's gate", errors=[404], action=ACTION, tags=TAGS)
async def resume_queue(request: Request) -> Response:
    return await _queue_gate(request, False)


async def _namespace_gate(request: Request, paused: bool) -> Response:
    principal = await authorize(request, ACTION, request.path_params["ns"])
    assert principal.namespace_id is not None
    audit_intent(
        request, "queues.pause" if paused else "queues.resume", "namespace",
        principal.namespace_id, principal.namespace_id,
    )  # fmt: skip
    if principal.queues is not None:  # the namespace gate stops every queue's starts
        raise Forbidden("a key limited to some queues may not pause or resume the namespace")
    gate = await service.set_namespace_paused(
        _ctx(request).db,
        principal.namespace_id,
        paused,
        actor=principal.actor,
        request_id=request_id(request),
    )
    return json_response(gate)


@api(
    "Pause the namespace gate (no new starts in any queue)", errors=[403, 404], action=ACTION,
    tags=TAGS,
)  # fmt: skip
async def pause_namespace(request: Request) -> Response:
    return await _namespace_gate(request, True)


@api("Resume the namespace gate", errors=[403, 404], action=ACTION, tags=TAGS)
async def resume_namespace(request: Request) -> Response:
    return await _namespace_gate(request, False)


@api("The namespace gate", errors=[404], action=ACTION, tags=TAGS)
async def get_namespace_gate(request: Request) -> Response:
    principal = await authorize(request, ACTION, request.path_params["ns"])
    assert principal.namespace_id is not None
    return json_response(await service.get_namespace_gate(_ctx(request).db, principal.namespace_id))


def routes() -> list[Route]:
    base = "/v1/namespaces/{ns}"
    return [
        Route(f"{base}/queues", list_queues, methods=["GET"]),
        Route(f"{base}/queues/{{queue}}", put_queue, methods=["PUT"]),
        Route(f"{base}/queues/{{queue}}", get_queue, methods=["GET"]),
        Route(f"{base}/queues/{{queue}}/pause", pause_queue, methods=["POST"]),
        Route(f"{base}/queues/{{queue}}/resume", resume_queue, methods=["POST"]),
        Route(f"{base}/pause", pause_namespace, methods=["POST"]),
        Route(f"{base}/resume", resume_namespace, methods=["POST"]),
        Route(f"{base}/gate", get_namespace_gate, methods=["GET"]),
    ]
