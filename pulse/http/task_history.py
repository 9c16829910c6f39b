"""``GET /v1/namespaces/{ns}/tasks/{id}/events`` (docs/api/tasks.md "History"): the task's
raw state events in order, cursor-paged, for a key with ``tasks.read``. A key limited to
some queues sees only the history of their tasks: another queue's task is the same 404 as
an absent one. The rules live in :mod:`pulse.task_history`."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.http.auth import authorize
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import parse_limit
from orbit.types import Action
from pulse import task_history

READ = Action.TASKS_READ.value


class TaskEventOut(msgspec.Struct, kw_only=True):
    """One raw state event of a task."""

    type: str
    created_at: str
    request_id: str | None
    data: dict[str, Any]


class TaskEventsOut(msgspec.Struct, kw_only=True):
    """A page of a task's history, oldest first."""

    task_id: str
    events: list[TaskEventOut]
    next_cursor: str | None


@api(
    "The task's raw state events in order (its history), oldest first",
    responses={200: TaskEventsOut}, errors=[400, 404], action=READ, tags=["tasks"],
    query=(
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def task_events(request: Request) -> Response:
    principal = await authorize(request, READ, request.path_params["ns"])
    assert principal.namespace_id is not None
    page = await task_history.task_events(
        request.app.state.ctx.db,
        principal.namespace_id,
        request.path_params["id"],
        limit=parse_limit(request.query_params.get("limit")),
        cursor=request.query_params.get("cursor"),
        visible=principal.may_use_queue,
    )
    return json_response(page)


def routes() -> list[Route]:
    return [Route("/v1/namespaces/{ns}/tasks/{id}/events", task_events, methods=["GET"])]


__all__ = ["routes"]
