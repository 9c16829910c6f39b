"""``PUT/GET /v1/namespaces/{ns}/retention`` (docs/api/admin.md "Retention"): the
namespace's retention windows and the purge progress; ``admin`` (a key limited to some
queues gets 403: the settings cover every queue). ``ETag``/``If-Match`` like queues. The
rules live in :mod:`orbit.retention`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import retention
from orbit.credentials import Principal
from orbit.errors import Forbidden
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.body import decode_optional, read_body
from orbit.http.etag import etag, preconditions
from orbit.http.openapi import api
from orbit.http.responses import json_response
from orbit.retention import RetentionPut
from orbit.types import Action

ADMIN = Action.ADMIN.value
TAGS = ["admin"]


async def _principal(request: Request) -> Principal:
    principal = await authorize(request, ADMIN, request.path_params["ns"])
    assert principal.namespace_id is not None
    if principal.queues is not None:
        raise Forbidden("retention settings need a key that is not limited to some queues")
    return principal


def _answer(view: dict[str, Any]) -> Response:
    return json_response(view, headers={"ETag": etag(int(view["revision"]))})


@api(
    "The namespace's retention windows and the purge progress (purged_total, last_run_at)",
    errors=[403, 404], action=ADMIN, etag=True, tags=TAGS,
)  # fmt: skip
async def get_retention(request: Request) -> Response:
    principal = await _principal(request)
    assert principal.namespace_id is not None
    return _answer(await retention.get_retention(request.app.state.ctx.db, principal.namespace_id))


@api(
    "Replace the namespace's retention windows (an unset window keeps that history forever)",
    body=RetentionPut, errors=[400, 403, 404, 412], action=ADMIN, etag=True, tags=TAGS,
)  # fmt: skip
async def put_retention(request: Request) -> Response:
    principal = await _principal(request)
    assert principal.namespace_id is not None
    audit_intent(request, retention.PUT_ACTION, "namespace", principal.namespace_id,
                 principal.namespace_id)  # fmt: skip
    ctx = request.app.state.ctx
    body = decode_optional(
        await read_body(request), RetentionPut, RetentionPut(),
        max_depth=ctx.settings.max_json_depth,
    )  # fmt: skip
    view = await retention.put_retention(
        ctx.db, principal.actor, principal.namespace_id, body,
        pre=preconditions(request), request_id=request_id(request),
    )  # fmt: skip
    return _answer(view)


def routes() -> list[Route]:
    return [
        Route("/v1/namespaces/{ns}/retention", get_retention, methods=["GET"]),
        Route("/v1/namespaces/{ns}/retention", put_retention, methods=["PUT"]),
    ]


__all__ = ["routes"]
