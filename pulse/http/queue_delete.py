"""``DELETE /v1/namespaces/{ns}/queues/{queue}`` (docs/api/queues.md "Delete a queue"):
``queues.manage``; 204, or 409 naming what holds the queue. The rules live in
:mod:`pulse.queue_delete`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.etag import preconditions
from orbit.http.openapi import api
from orbit.types import Action, check_name
from pulse import queue_delete as service

ACTION = Action.QUEUES_MANAGE.value


@api(
    "Delete a queue: 204 when nothing holds it, else 409 naming its unfinished tasks, "
    "schedules and worker sessions; finished tasks stay as history",
    responses={204: None}, errors=[403, 404, 409, 412], action=ACTION, tags=["queues"],
)  # fmt: skip
async def delete_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    principal = await authorize(request, ACTION, request.path_params["ns"], queue=name)
    check_name(name, "queue")
    assert principal.namespace_id is not None
    audit_intent(request, service.DELETE_ACTION, "queue", name, principal.namespace_id)
    await service.delete_queue(
        request.app.state.ctx.db,
        principal.namespace_id,
        name,
        pre=preconditions(request),
        actor=principal.actor,
        request_id=request_id(request),
    )
    return Response(status_code=204)


def routes() -> list[Route]:
    return [Route("/v1/namespaces/{ns}/queues/{queue}", delete_queue, methods=["DELETE"])]


__all__ = ["routes"]
