"""Re-run routes (docs/api/tasks.md "Re-run a finished task"), action ``tasks.resolve``.

| method | path | answer |
| --- | --- | --- |
| POST | ``/v1/namespaces/{ns}/tasks/{id}/retry`` | 200 the task (WAITING); 409 not FAILED/CANCELLED; 429 quota |
| POST | ``/v1/namespaces/{ns}/tasks:retry`` | 200 ``{"retried", "quota_refused"}``; ``dry_run``: ``{"matched", "more"}`` |

A key limited to some queues re-runs only tasks of those queues (another queue's task is a
404) and must name one of them in a bulk re-run (403 otherwise). The rules live in
:mod:`pulse.rerun`.
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
from orbit.http.body import decode, read_body
from orbit.http.openapi import api
from orbit.http.responses import json_response
from orbit.types import Action
from pulse import rerun as service
from pulse import tasks
from pulse.errors import TaskNotFound
from pulse.rerun import Rerun, RerunBulk

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

ACTION = Action.TASKS_RESOLVE.value
TAGS = ["tasks"]


@api(
    "Re-run a FAILED or CANCELLED task: back to WAITING with a new generation (note required)",
    body=Rerun, errors=[400, 403, 404, 409, 429], action=ACTION, tags=TAGS,
)  # fmt: skip
async def rerun_task(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, ACTION, request.path_params["ns"])
    assert principal.namespace_id is not None
    task_id = request.path_params["id"]
    audit_intent(request, service.ACTION, "task", task_id, principal.namespace_id)
    ctx = rt.ctx
    body = decode(await read_body(request), Rerun, max_depth=ctx.settings.max_json_depth)
    view = await tasks.get_task(ctx.db, principal.namespace_id, task_id)
    if not principal.may_use_queue(view["queue"]):
        raise TaskNotFound()
    out = await service.rerun_task(
        ctx.db, principal.namespace_id, task_id, body, actor=principal.actor,
        hub=rt.hub, request_id=request_id(request),
    )  # fmt: skip
    return json_response(out)


@api(
    "Re-run every finished task of a filter (states, queue, kind, owner, error type, finish "
    "time), in bounded batches; dry_run counts",
    body=RerunBulk, errors=[400, 403, 404], action=ACTION, tags=TAGS,
)  # fmt: skip
async def rerun_bulk(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, ACTION, request.path_params["ns"])
    assert principal.namespace_id is not None
    audit_intent(request, service.BULK_ACTION, "namespace", principal.namespace_id,
                 principal.namespace_id)  # fmt: skip
    ctx = rt.ctx
    body = decode(await read_body(request), RerunBulk, max_depth=ctx.settings.max_json_depth)
    if principal.queues is not None and (body.queue is None or body.queue not in principal.queues):
        raise Forbidden("this key is limited to some queues: name an allowed queue")
    out = await service.rerun_bulk(
        ctx.db, principal.namespace_id, body, actor=principal.actor,
        hub=rt.hub, request_id=request_id(request),
    )  # fmt: skip
    return json_response(out)


def routes(rt: PulseRuntime) -> list[Route]:
    base = "/v1/namespaces/{ns}"
    return [
        Route(f"{base}/tasks:retry", partial(rerun_bulk, rt), methods=["POST"]),
        Route(f"{base}/tasks/{{id}}/retry", partial(rerun_task, rt), methods=["POST"]),
    ]


__all__ = ["routes"]
