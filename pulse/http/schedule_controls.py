"""Schedule control routes (docs/api/schedules.md "Trigger", "Backfill", "Delete").

| method | path | action | answer |
| --- | --- | --- | --- |
| POST | ``/v1/namespaces/{ns}/schedules/{name}/trigger`` | schedules.manage | 201 ``{"occurrence", "task"}``; 200 for a known ``idempotency_key`` |
| POST | ``/v1/namespaces/{ns}/schedules/{name}/backfill`` | schedules.manage | 202 ``{"count", "already_occurred", "fire_times", "from", "to"}`` |
| DELETE | ``/v1/namespaces/{ns}/schedules/{name}`` | schedules.manage | 204 |

The rules live in :mod:`pulse.schedule_controls`; handlers decode, authorise and translate.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.context import AppContext
from orbit.credentials import Principal
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authorize
from orbit.http.body import decode, decode_optional, read_body
from orbit.http.etag import preconditions
from orbit.http.openapi import api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.types import Action, check_name
from pulse import schedule_controls as service
from pulse.hub import wake_queue
from pulse.schedule_controls import BackfillBody, TriggerBody

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime

MANAGE = Action.SCHEDULES_MANAGE.value
TAGS = ["schedules"]


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def _ns(principal: Principal) -> bytes:
    assert principal.namespace_id is not None
    return principal.namespace_id


async def _wake(rt: PulseRuntime, namespace_id: bytes, queue_ids: frozenset[bytes]) -> None:
    for queue_id in sorted(queue_ids):
        await wake_queue(rt.hub, namespace_id, queue_id)


async def _authorize(request: Request, action: str) -> tuple[Principal, str]:
    name = request.path_params["name"]
    principal = await authorize(request, MANAGE, request.path_params["ns"])
    check_name(name, "name")
    audit_intent(request, action, "schedule", name, _ns(principal))
    return principal, name


@api(
    "Fire a schedule once now (exactly one occurrence; idempotent with a key)",
    body=TriggerBody, responses={201: None, 200: None}, errors=[400, 403, 404, 429],
    action=MANAGE, idempotent=True, tags=TAGS,
)  # fmt: skip
async def trigger_schedule(rt: PulseRuntime, request: Request) -> Response:
    principal, name = await _authorize(request, service.TRIGGER_ACTION)
    ctx = _ctx(request)
    raw = await read_body(request)
    body = decode_optional(raw, TriggerBody, TriggerBody(), max_depth=ctx.settings.max_json_depth)
    res = await service.trigger_schedule(
        ctx.db,
        _ns(principal),
        name,
        body,
        idem=await idem_request(request),
        actor=principal.actor,
        request_id=request_id(request),
        allowed_queues=principal.queues,
    )
    if res.new_work is not None:
        await _wake(rt, _ns(principal), frozenset([res.new_work]))
    return reply_response(res.reply)


@api(
    "Backfill a past range: the task of every fire time in [from, to) that has not run",
    body=BackfillBody, responses={202: None}, errors=[400, 403, 404, 429], action=MANAGE,
    tags=TAGS,
)  # fmt: skip
async def backfill_schedule(rt: PulseRuntime, request: Request) -> Response:
    principal, name = await _authorize(request, service.BACKFILL_ACTION)
    ctx = _ctx(request)
    body = decode(await read_body(request), BackfillBody, max_depth=ctx.settings.max_json_depth)
    res = await service.backfill_schedule(
        ctx.db,
        _ns(principal),
        name,
        body,
        actor=principal.actor,
        request_id=request_id(request),
        allowed_queues=principal.queues,
    )
    await _wake(rt, _ns(principal), res.new_work)
    return json_response(res.answer, 202)


@api(
    "Delete a schedule (its versions, occurrences and tasks stay as history)",
    responses={204: None}, errors=[403, 404, 412], action=MANAGE, tags=TAGS,
)  # fmt: skip
async def delete_schedule(request: Request) -> Response:
    principal, name = await _authorize(request, service.DELETE_ACTION)
    await service.delete_schedule(
        _ctx(request).db,
        _ns(principal),
        name,
        pre=preconditions(request),
        actor=principal.actor,
        request_id=request_id(request),
        allowed_queues=principal.queues,
    )
    return Response(status_code=204)


def routes(rt: PulseRuntime) -> list[Route]:
    base = "/v1/namespaces/{ns}/schedules/{name}"
    return [
        Route(f"{base}/trigger", partial(trigger_schedule, rt), methods=["POST"]),
        Route(f"{base}/backfill", partial(backfill_schedule, rt), methods=["POST"]),
        Route(base, delete_schedule, methods=["DELETE"]),
    ]


__all__ = ["routes"]
