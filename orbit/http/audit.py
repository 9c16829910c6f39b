"""``GET /v1/namespaces/{ns}/audit`` (docs/api/admin.md "Audit events"): the namespace's
audit events, newest first, for a key with ``admin`` that is not limited to some queues
(403 otherwise: the trail covers every queue). Filters ``outcome``, ``action``,
``since``, ``until``; cursor-paged. The rules live in :func:`orbit.audit.list_audit`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import audit
from orbit.errors import Forbidden
from orbit.http.auth import authorize
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import parse_limit
from orbit.times import Time
from orbit.types import Action

ADMIN = Action.ADMIN.value


@api(
    "Audit events of the namespace, newest first (who did what, with which outcome)",
    errors=[400, 403, 404], action=ADMIN, tags=["admin"],
    query=(
        QueryParam("outcome", str, "ok, denied, conflict or error",
                   enum=tuple(o.value for o in audit.Outcome)),
        QueryParam("action", str, "an action name, e.g. tasks.cancel"),
        QueryParam("since", Time, "RFC 3339, inclusive"),
        QueryParam("until", Time, "RFC 3339, exclusive (after since)"),
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_audit(request: Request) -> Response:
    principal = await authorize(request, ADMIN, request.path_params["ns"])
    assert principal.namespace_id is not None
    if principal.queues is not None:  # the trail covers every queue of the namespace
        raise Forbidden("the audit trail needs a key that is not limited to some queues")
    q = request.query_params
    page = await audit.list_audit(
        request.app.state.ctx.db,
        principal.namespace_id,
        outcome=q.get("outcome") or None,
        action=q.get("action") or None,
        since=q.get("since") or None,
        until=q.get("until") or None,
        limit=parse_limit(q.get("limit")),
        cursor=q.get("cursor"),
    )
    return json_response(page)


def routes() -> list[Route]:
    return [Route("/v1/namespaces/{ns}/audit", list_audit, methods=["GET"])]


__all__ = ["routes"]
