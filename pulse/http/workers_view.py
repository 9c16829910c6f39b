"""The operator's worker routes (docs/api/workers.md "Connected workers").

| method | path | action | answer |
| --- | --- | --- | --- |
| GET | ``/v1/namespaces/{ns}/workers`` | tasks.read | ``{"sessions": [...], "next_cursor"}`` |
| POST | ``/v1/namespaces/{ns}/workers/{sid}/close`` | queues.manage | 200 what the close did |

A key limited to some queues must name one of them in ``?queue=`` (403 otherwise). The rules
live in :mod:`pulse.workers_view`; a close also ends the session's stream on this node
(other nodes end theirs at the worker's next heartbeat).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.errors import Forbidden
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import parse_limit
from orbit.types import Action
from pulse import workers_view as service
from pulse.hub import CLOSE_SESSION_GONE

READ = Action.TASKS_READ.value
if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

MANAGE = Action.QUEUES_MANAGE.value
TAGS = ["workers"]


@api(
    "Worker sessions of the namespace (ACTIVE by default) with their instance, queues, "
    "capacity, in-flight attempts, heartbeat age and node",
    errors=[400, 403, 404], action=READ, tags=TAGS,
    query=(
        QueryParam("state", str, "ACTIVE (default), CLOSED, EXPIRED or any",
                   enum=(*service.STATES, "any")),
        QueryParam("queue", str, "only sessions that take work from this queue"),
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_workers(request: Request) -> Response:
    principal = await authorize(request, READ, request.path_params["ns"])
    assert principal.namespace_id is not None
    queue = request.query_params.get("queue") or None
    if principal.queues is not None and (queue is None or queue not in principal.queues):
        raise Forbidden("this key is limited to some queues: name an allowed queue")
    state: str | None = request.query_params.get("state") or "ACTIVE"
    page = await service.list_workers(
        request.app.state.ctx.db,
        principal.namespace_id,
        state=None if state == "any" else state,
        queue=queue,
        limit=parse_limit(request.query_params.get("limit")),
        cursor=request.query_params.get("cursor"),
    )
    return json_response(page)


@api(
    "Close a worker session: its offers are released, its running attempts are recovered "
    "(retried when retry_safe, else NEEDS_REVIEW); idempotent",
    errors=[403, 404], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def close_worker(rt: PulseRuntime, request: Request) -> Response:
    sid = request.path_params["sid"]
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    assert principal.namespace_id is not None
    if principal.queues is not None:
        raise Forbidden("a key limited to some queues may not close worker sessions")
    audit_intent(request, "workers.close", "worker_session", sid, principal.namespace_id)
    answer, ended = await service.close_worker(
        rt.db, principal.namespace_id, sid, actor=principal.actor,
        request_id=request_id(request),
    )  # fmt: skip
    hub = rt.hub
    for attempt_id in ended:
        hub.forget(attempt_id)
    if answer.state == "CLOSED":
        session_id = bytes.fromhex(answer.session_id)
        await hub.close_session(
            principal.namespace_id, session_id, CLOSE_SESSION_GONE, "closed_by_operator"
        )
    if ended:
        hub.notify_new_work()
    return json_response(answer)


def routes(rt: PulseRuntime) -> list[Route]:
    base = "/v1/namespaces/{ns}/workers"
    return [
        Route(base, list_workers, methods=["GET"]),
        Route(f"{base}/{{sid}}/close", partial(close_worker, rt), methods=["POST"]),
    ]


__all__ = ["routes"]
