"""Schedule routes (docs/api/schedules.md).

| method | path | action | answer |
| --- | --- | --- | --- |
| PUT | ``/v1/namespaces/{ns}/schedules/{name}`` | schedules.manage | 201 created / 200 new version or no-op; ``ETag`` |
| GET | ``/v1/namespaces/{ns}/schedules/{name}`` | schedules.manage or tasks.read | schedule; ``ETag`` |
| GET | ``/v1/namespaces/{ns}/schedules`` | schedules.manage or tasks.read | ``{"items", "next_cursor"}`` (additive) |
| POST | ``/v1/namespaces/{ns}/schedules/{name}/pause`` / ``resume`` | schedules.manage | schedule; idempotent |
| GET | ``/v1/namespaces/{ns}/schedules/{name}/occurrences`` | schedules.manage or tasks.read | ``{"items", "next_cursor"}`` |

A key limited to some queues may only publish schedules for those queues (403 otherwise)
and sees only schedules whose current version uses one of them (others are 404).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.context import AppContext
from orbit.credentials import Principal
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authenticated, authorize, check_queue
from orbit.http.body import decode, read_body
from orbit.http.etag import etag, preconditions
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import parse_limit
from orbit.types import Action, check_name
from pulse import schedules as service
from pulse.schedules import SchedulePut

MANAGE = Action.SCHEDULES_MANAGE.value
READ = Action.TASKS_READ.value
TAGS = ["schedules"]


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def _authorize_read(conn: HTTPConnection) -> Principal:
    """Reads accept ``schedules.manage`` or ``tasks.read``."""
    principal = await authenticated(conn)
    action = MANAGE if principal.may(MANAGE) or not principal.may(READ) else READ
    return await authorize(conn, action, conn.path_params["ns"])


def _ns(principal: Principal) -> bytes:
    assert principal.namespace_id is not None
    return principal.namespace_id


def _response(view: dict[str, Any], status: int = 200) -> Response:
    return json_response(view, status, headers={"ETag": etag(int(view["revision"]))})


@api(
    "Publish a new immutable schedule version (create or update)", body=SchedulePut,
    responses={201: None, 200: None}, errors=[400, 403, 404, 412], action=MANAGE, etag=True,
    tags=TAGS,
)  # fmt: skip
async def put_schedule(request: Request) -> Response:
    name = request.path_params["name"]
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    check_name(name, "name")
    audit_intent(request, service.PUT_ACTION, "schedule", name, _ns(principal))
    ctx = _ctx(request)
    body = decode(await read_body(request), SchedulePut, max_depth=ctx.settings.max_json_depth)
    check_queue(principal, body.queue)
    res = await service.put_schedule(
        ctx.db,
        _ns(principal),
        principal.application_id,
        name,
        body,
        pre=preconditions(request),
        actor=principal.actor,
        request_id=request_id(request),
        allowed_queues=principal.queues,
    )
    return _response(res.schedule, 201 if res.created else 200)


@api(
    "A schedule: current version, next fire time, covered_until",
    errors=[404], action=f"{MANAGE} or {READ}", etag=True, tags=TAGS,
)  # fmt: skip
async def get_schedule(request: Request) -> Response:
    principal = await _authorize_read(request)
    view = await service.get_schedule(
        _ctx(request).db,
        _ns(principal),
        request.path_params["name"],
        allowed_queues=principal.queues,
    )
    return _response(view)


@api(
    "Schedules of the namespace by name", errors=[400, 404], action=f"{MANAGE} or {READ}",
    tags=TAGS,
    query=(
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_schedules(request: Request) -> Response:
    principal = await _authorize_read(request)
    page = await service.list_schedules(
        _ctx(request).db,
        _ns(principal),
        limit=parse_limit(request.query_params.get("limit")),
        cursor=request.query_params.get("cursor"),
        allowed_queues=principal.queues,
    )
    return json_response(page)


async def _pause(request: Request, paused: bool) -> Response:
    name = request.path_params["name"]
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    action = service.PAUSE_ACTION if paused else service.RESUME_ACTION
    audit_intent(request, action, "schedule", name, _ns(principal))
    fn = service.pause_schedule if paused else service.resume_schedule
    view = await fn(
        _ctx(request).db,
        _ns(principal),
        name,
        actor=principal.actor,
        request_id=request_id(request),
        allowed_queues=principal.queues,
    )
    return _response(view)


@api(
    "Pause a schedule (what is already due fires first); idempotent",
    errors=[404], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def pause_schedule(request: Request) -> Response:
    return await _pause(request, True)


@api(
    "Resume a schedule (fire times during the pause are recorded as skipped); idempotent",
    errors=[404], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def resume_schedule(request: Request) -> Response:
    return await _pause(request, False)


@api(
    "Occurrences of a schedule, newest fire time first", errors=[400, 404],
    action=f"{MANAGE} or {READ}", tags=TAGS,
    query=(
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
        QueryParam("outcome", str, "created or skipped", enum=service.OUTCOMES),
    ),
)  # fmt: skip
async def list_occurrences(request: Request) -> Response:
    principal = await _authorize_read(request)
    page = await service.list_occurrences(
        _ctx(request).db,
        _ns(principal),
        request.path_params["name"],
        limit=parse_limit(request.query_params.get("limit")),
        cursor=request.query_params.get("cursor"),
        outcome=request.query_params.get("outcome") or None,
        allowed_queues=principal.queues,
    )
    return json_response(page)


def routes() -> list[Route]:
    base = "/v1/namespaces/{ns}/schedules"
    return [
        Route(base, list_schedules, methods=["GET"]),
        Route(f"{base}/{{name}}", put_schedule, methods=["PUT"]),
        Route(f"{base}/{{name}}", get_schedule, methods=["GET"]),
        Route(f"{base}/{{name}}/pause", pause_schedule, methods=["POST"]),
        Route(f"{base}/{{name}}/resume", resume_schedule, methods=["POST"]),
        Route(f"{base}/{{name}}/occurrences", list_occurrences, methods=["GET"]),
    ]
