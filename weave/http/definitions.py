"""Workflow definition routes (docs/api/workflows.md: versions), action ``workflows.manage``.

| method | path |
| --- | --- |
| POST | /v1/namespaces/{ns}/workflows/{name}/versions (201 new version, 200 unchanged) |
| GET | /v1/namespaces/{ns}/workflows/{name} (the workflow and its versions, newest first) |
| GET | /v1/namespaces/{ns}/workflows/{name}/versions/{version} (one version, exact text) |
| GET | /v1/namespaces/{ns}/workflows (list; additive) |
| DELETE | /v1/namespaces/{ns}/workflows/{name} (204; 409 while instances run; additive) |
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from orbit.context import AppContext
from orbit.errors import Forbidden, NotFound
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import Principal, authorize
from orbit.http.body import decode_body
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.types import Action, check_name
from weave import definitions
from weave.types import PublishBody, VersionOut, WorkflowOut, WorkflowPage

TAGS = ["workflows"]
MANAGE = Action.WORKFLOWS_MANAGE.value
_PAGE = (
    QueryParam("limit", int, "page size, 1-500 (default 50)"),
    QueryParam("cursor", str, "next_cursor of the previous page"),
)


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def _namespace(principal: Principal) -> bytes:
    """The authorised ``{ns}`` id (set by :func:`authorize` when a namespace is named)."""
    assert principal.namespace_id is not None
    return principal.namespace_id


@api(
    "Publish a new immutable version of a workflow definition (validated first)",
    body=PublishBody, responses={201: VersionOut, 200: VersionOut}, errors=[400, 404, 409, 422],
    action=MANAGE, idempotent=True, tags=TAGS,
)  # fmt: skip
async def publish_version(request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    name = check_name(request.path_params["name"], "name")
    body = await decode_body(request, PublishBody)
    ns_id = _namespace(principal)
    audit_intent(request, definitions.PUBLISH, "workflow", name, ns_id)
    reply = await definitions.publish_version(
        _ctx(request).db, principal.actor, ns_id, name, bytes(body.definition),
        request_id=request_id(request), idem=await idem_request(request),
    )  # fmt: skip
    return reply_response(reply)


@api(
    "Read a workflow and its versions (newest first, paged with limit/cursor)",
    responses={200: WorkflowOut}, errors=[404], action=MANAGE, query=_PAGE, tags=TAGS,
)  # fmt: skip
async def get_workflow(request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    name = request.path_params["name"]
    limit = parse_limit(request.query_params.get("limit"))
    position = decode_cursor(
        request.query_params.get("cursor"), definitions.version_cursor_filters(name)
    )
    before = position.get("before") if position else None
    if position is not None and not isinstance(before, int):
        before = 0
    out = await definitions.get_workflow(
        _ctx(request).db, _namespace(principal), name, before_version=before, limit=limit
    )
    return json_response(out)


@api(
    "Read one version of a workflow, with its definition exactly as published",
    responses={200: VersionOut}, errors=[404], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def get_version(request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    raw = request.path_params["version"]
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses; at most 10
    # digits, so int() never meets a huge string.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10) or not 1 <= int(raw) <= 2**32 - 1:
        raise NotFound("workflow version")
    out = await definitions.get_version(
        _ctx(request).db, _namespace(principal), request.path_params["name"], int(raw)
    )
    return json_response(out)


@api(
    "List the namespace's workflows by name",
    responses={200: WorkflowPage}, action=MANAGE, query=_PAGE, tags=TAGS,
)  # fmt: skip
async def list_workflows(request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    limit = parse_limit(request.query_params.get("limit"))
    position = decode_cursor(request.query_params.get("cursor"))
    after = position.get("after") if position else ""
    rows = await definitions.list_workflows(
        _ctx(request).db,
        _namespace(principal),
        after if isinstance(after, str) else "",
        limit,
    )
    nxt = encode_cursor({"after": rows[-1].name}) if len(rows) == limit else None
    return json_response(WorkflowPage([definitions.workflow_summary(r) for r in rows], nxt))


@api(
    "Delete a workflow definition (409 while instances run; versions and finished "
    "instances stay as history)",
    responses={204: None}, errors=[403, 404, 409], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def delete_workflow(request: Request) -> Response:
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    name = check_name(request.path_params["name"], "name")
    ns_id = _namespace(principal)
    audit_intent(request, definitions.DELETE, "workflow", name, ns_id)
    if principal.queues is not None:  # a workflow's steps may use any queue
        raise Forbidden("a key limited to some queues may not delete workflows")
    await definitions.delete_definition(
        _ctx(request).db, principal.actor, ns_id, name, request_id=request_id(request)
    )
    return Response(status_code=204)


def routes() -> list[BaseRoute]:
    base = "/v1/namespaces/{ns}/workflows"
    return [
        Route(base, list_workflows, methods=["GET"]),
        Route(f"{base}/{{name}}", get_workflow, methods=["GET"]),
        Route(f"{base}/{{name}}", delete_workflow, methods=["DELETE"]),
        Route(f"{base}/{{name}}/versions", publish_version, methods=["POST"]),
        Route(f"{base}/{{name}}/versions/{{version}}", get_version, methods=["GET"]),
    ]
