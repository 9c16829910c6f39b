"""Task routes (docs/api/tasks.md): submit (single and batch), read, list, attempts, cancel
(single and bulk), resolve.

| method | path | action | answer |
| --- | --- | --- | --- |
| POST | ``/v1/namespaces/{ns}/tasks`` | tasks.submit | 201 task / 200 ``deduplicated`` |
| POST | ``/v1/namespaces/{ns}/tasks:batch`` | tasks.submit | 200 ``{"items": [...]}`` |
| GET | ``/v1/namespaces/{ns}/tasks/{id}`` | tasks.read | task |
| GET | ``/v1/namespaces/{ns}/tasks`` | tasks.read | ``{"items", "next_cursor"}`` (``?stuck=true``) |
| GET | ``/v1/namespaces/{ns}/tasks/{id}/attempts`` | tasks.read | attempts with evidence |
| POST | ``/v1/namespaces/{ns}/tasks/{id}/cancel`` | tasks.cancel | 200 / 202 / 409 |
| POST | ``/v1/namespaces/{ns}/tasks:cancel`` | tasks.cancel | ``{"cancelled", "cancel_requested"}`` |
| POST | ``/v1/namespaces/{ns}/tasks/{id}/resolve`` | tasks.resolve | task / 409 |

A key limited to some queues (credential ``queues``) may only submit to, read, cancel and
resolve tasks of those queues; a task of another queue is the same 404 as an absent one,
and lists/bulk cancel must name an allowed ``queue``.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.context import AppContext
from orbit.credentials import Principal
from orbit.errors import Forbidden, InvalidRequest
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize, check_queue
from orbit.http.body import decode, read_body
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.metrics import conflicts
from orbit.pagination import parse_limit
from orbit.storage.fairness import current_tenant
from orbit.types import Action, IdText
from pulse import submit, tasks
from pulse.errors import TaskNotFound
from pulse.hub import wake_queue
from pulse.types import BatchSubmit, CancelBulk, Resolve, TaskListFilters, TaskState, TaskSubmit

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

TAGS = ["tasks"]


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def _body(request: Request, type_: type[Any]) -> Any:
    return decode(await read_body(request), type_, max_depth=_ctx(request).settings.max_json_depth)


async def _wake(rt: PulseRuntime, namespace_id: bytes, queue_ids: frozenset[bytes]) -> None:
    for queue_id in sorted(queue_ids):
        await wake_queue(rt.hub, namespace_id, queue_id)


def _require_queue_filter(principal: Principal, queue: str | None) -> None:
    if principal.queues is not None and (queue is None or queue not in principal.queues):
        raise Forbidden("this key is limited to some queues: name an allowed queue")


async def _visible(request: Request, principal: Principal, task_id: str) -> dict[str, Any]:
    """The task, or 404 when absent or in a queue the key may not use."""
    assert principal.namespace_id is not None
    view = await tasks.get_task(_ctx(request).db, principal.namespace_id, task_id)
    if not principal.may_use_queue(view["queue"]):
        raise TaskNotFound()
    return view


@api(
    "Submit a task", body=TaskSubmit, responses={201: None, 200: None},
    errors=[400, 403, 404, 422, 429], action=Action.TASKS_SUBMIT.value, idempotent=True,
    tags=TAGS,
)  # fmt: skip
async def submit_task(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_SUBMIT.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    audit_intent(request, submit.OPERATION, "task", None, principal.namespace_id)
    body: TaskSubmit = await _body(request, TaskSubmit)
    check_queue(principal, body.queue)
    ctx = _ctx(request)
    idem = await idem_request(request)
    if idem is None:  # group-committed with the node's other single submits (pulse/batcher.py)
        res = await rt.submit_batches.submit(
            principal.namespace_id,
            principal.application_id,
            submit.SingleSubmit(body, principal.actor, request_id(request)),
        )
    else:
        res = await submit.submit_one(
            ctx.db,
            principal.namespace_id,
            principal.application_id,
            body,
            idem=idem,
            actor=principal.actor,
            request_id=request_id(request),
            retention_s=ctx.settings.idempotency_retention_s,
        )
    await _wake(rt, principal.namespace_id, res.new_work)
    return reply_response(res.reply)


@api(
    "Submit up to 1000 tasks in one transaction (per-item results)", body=BatchSubmit,
    errors=[400, 404, 422], action=Action.TASKS_SUBMIT.value, idempotent=True, tags=TAGS,
)  # fmt: skip
async def submit_tasks_batch(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_SUBMIT.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    audit_intent(request, submit.OPERATION, "task", None, principal.namespace_id)
    batch: BatchSubmit = await _body(request, BatchSubmit)
    ctx = _ctx(request)
    res = await submit.submit_batch(
        ctx.db,
        principal.namespace_id,
        principal.application_id,
        batch.tasks,
        allowed_queues=principal.queues,
        idem=await idem_request(request),
        actor=principal.actor,
        request_id=request_id(request),
        retention_s=ctx.settings.idempotency_retention_s,
    )
    await _wake(rt, principal.namespace_id, res.new_work)
    if res.refused and not res.replayed:  # per-item 429s never reach the error handler
        conflicts(ctx.metrics).inc(res.refused, kind="quota_exceeded")
    return reply_response(res.reply)


@api("A task", errors=[404], action=Action.TASKS_READ.value, tags=TAGS)
async def get_task(request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_READ.value, request.path_params["ns"])
    return json_response(await _visible(request, principal, request.path_params["id"]))


@api(
    "Tasks of the namespace, oldest first", errors=[400, 403, 404, 429],
    action=Action.TASKS_READ.value, tags=TAGS,
    query=(
        QueryParam("queue", str, "queue name"),
        QueryParam("state", str, "WAITING, LEASED, RUNNING, SUCCEEDED, FAILED, CANCELLED, NEEDS_REVIEW",
                   enum=tuple(s.value for s in TaskState)),
        QueryParam("kind", str, "task kind"),
        QueryParam("owner_id", IdText, "owning application id (32 hex)"),
        QueryParam("dedup_key", str, "dedup key"),
        QueryParam(
            "stuck", str,
            "true (or 1): only tasks the stuck-work watchdog surfaced in their current state; "
            "false (or 0): only the others",
            enum=("true", "1", "false", "0"),
        ),
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page (same filters)"),
    ),
)  # fmt: skip
async def list_tasks(request: Request) -> Response:
    _ctx(request).list_bytes.refuse_early(current_tenant.get(), "tasks")  # before the key is checked
    principal = await authorize(request, Action.TASKS_READ.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    q = request.query_params
    filters = TaskListFilters(
        queue=q.get("queue"),
        state=q.get("state"),
        kind=q.get("kind"),
        owner_id=q.get("owner_id"),
        dedup_key=q.get("dedup_key"),
    )
    _require_queue_filter(principal, filters.queue)
    page = await tasks.list_tasks(
        _ctx(request).db,
        principal.namespace_id,
        filters,
        limit=parse_limit(q.get("limit")),
        cursor=q.get("cursor"),
        stuck=_parse_stuck(q.get("stuck")),
        max_bytes=_ctx(request).settings.max_page_bytes,
        charge=_ctx(request).list_bytes.charge_for(principal.application_id),
    )
    return json_response(page)


def _parse_stuck(raw: str | None) -> bool | None:
    """``?stuck=``: true/1 or false/0 (absent or empty: no filter); anything else is a 400."""
    if raw is None or raw == "":
        return None
    value = raw.lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise InvalidRequest("stuck must be true or false", field="stuck")


@api(
    "Attempts of a task with their evidence",
    errors=[404],
    action=Action.TASKS_READ.value,
    tags=TAGS,
)
async def list_attempts(request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_READ.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    await _visible(request, principal, request.path_params["id"])
    out = await tasks.list_attempts(
        _ctx(request).db, principal.namespace_id, request.path_params["id"]
    )
    return json_response(out)


@api(
    "Cancel a task: 200 CANCELLED (waiting/leased, or already), 202 cancel requested (running)",
    responses={200: None, 202: None}, errors=[404, 409], action=Action.TASKS_CANCEL.value,
    tags=TAGS,
)  # fmt: skip
async def cancel_task(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_CANCEL.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    task_id = request.path_params["id"]
    audit_intent(request, "tasks.cancel", "task", task_id, principal.namespace_id)
    await _visible(request, principal, task_id)
    out = await tasks.cancel_task(
        _ctx(request).db,
        principal.namespace_id,
        task_id,
        hub=rt.hub,
        actor=principal.actor,
        request_id=request_id(request),
    )
    return json_response(out.task, out.status)


@api(
    "Cancel every matching task (owner_id, queue, kind), in bounded batches", body=CancelBulk,
    errors=[400, 403, 404], action=Action.TASKS_CANCEL.value, tags=TAGS,
)  # fmt: skip
async def cancel_tasks_bulk(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_CANCEL.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    audit_intent(
        request, "tasks.cancel_bulk", "namespace", principal.namespace_id, principal.namespace_id
    )
    raw = await read_body(request)
    body = decode(raw, CancelBulk) if raw.strip() else CancelBulk()
    _require_queue_filter(principal, body.queue)
    out = await tasks.cancel_bulk(
        _ctx(request).db,
        principal.namespace_id,
        owner_id=body.owner_id,
        queue=body.queue,
        kind=body.kind,
        hub=rt.hub,
        actor=principal.actor,
        request_id=request_id(request),
    )
    return json_response(out)


@api(
    "Resolve a NEEDS_REVIEW task: retry, succeed or fail (note required)", body=Resolve,
    errors=[400, 404, 409], action=Action.TASKS_RESOLVE.value, tags=TAGS,
)  # fmt: skip
async def resolve_task(rt: PulseRuntime, request: Request) -> Response:
    principal = await authorize(request, Action.TASKS_RESOLVE.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    task_id = request.path_params["id"]
    audit_intent(request, "tasks.resolve", "task", task_id, principal.namespace_id)
    body: Resolve = await _body(request, Resolve)
    await _visible(request, principal, task_id)
    view = await tasks.resolve_task(
        _ctx(request).db,
        principal.namespace_id,
        task_id,
        body,
        actor=principal.actor,
        hub=rt.hub,
        request_id=request_id(request),
    )
    return json_response(view)


def routes(rt: PulseRuntime) -> list[Route]:
    """Every task route; the submit, cancel and resolve handlers are bound to ``rt``."""
    base = "/v1/namespaces/{ns}"
    return [
        Route(f"{base}/tasks", partial(submit_task, rt), methods=["POST"]),
        Route(f"{base}/tasks", list_tasks, methods=["GET"]),
        Route(f"{base}/tasks:batch", partial(submit_tasks_batch, rt), methods=["POST"]),
        Route(f"{base}/tasks:cancel", partial(cancel_tasks_bulk, rt), methods=["POST"]),
        Route(f"{base}/tasks/{{id}}", get_task, methods=["GET"]),
        Route(f"{base}/tasks/{{id}}/attempts", list_attempts, methods=["GET"]),
        Route(f"{base}/tasks/{{id}}/cancel", partial(cancel_task, rt), methods=["POST"]),
        Route(f"{base}/tasks/{{id}}/resolve", partial(resolve_task, rt), methods=["POST"]),
    ]
