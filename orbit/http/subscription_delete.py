"""``DELETE /v1/namespaces/{ns}/subscriptions/{name}`` (docs/api/subscriptions.md "Delete"):
``subscriptions.manage``; 204; ``If-Match`` makes it conditional. A key limited to some
queues deletes only subscriptions it can see (their filter names only its queues; else
404). The rules live in :func:`orbit.subscriptions.delete_subscription`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import subscriptions
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.etag import preconditions
from orbit.http.openapi import api
from orbit.types import Action, check_name

MANAGE = Action.SUBSCRIPTIONS_MANAGE.value


@api(
    "Delete a subscription (its deliveries stay as history; its streams end)",
    responses={204: None}, errors=[403, 404, 412], action=MANAGE, tags=["subscriptions"],
)  # fmt: skip
async def delete_subscription(request: Request) -> Response:
    name = request.path_params["name"]
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    check_name(name, "name")
    assert principal.namespace_id is not None
    audit_intent(request, subscriptions.DELETE_ACTION, "subscription", name,
                 principal.namespace_id)  # fmt: skip
    await subscriptions.delete_subscription(
        request.app.state.ctx.db,
        principal.actor,
        principal.namespace_id,
        name,
        precondition=preconditions(request).check,
        allowed_queues=principal.queues,
        request_id=request_id(request),
    )
    return Response(status_code=204)


def routes() -> list[Route]:
    return [
        Route("/v1/namespaces/{ns}/subscriptions/{name}", delete_subscription,
              methods=["DELETE"]),
    ]  # fmt: skip


__all__ = ["routes"]
