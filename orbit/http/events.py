"""``GET /v1/namespaces/{ns}/events``: the namespace's result events by sequence.

Query: ``after_seq`` (default 0: from the start) or ``cursor`` (from a previous page), and
``limit`` (default 50, max 500). Needs the ``events.read`` action. Answer:
``{"items": [...], "next_cursor": ... | null, "next_after_seq": n}``; ``next_after_seq`` is
the seq of the last event looked at (or the ``after_seq`` asked for when none was), so a
poller can keep asking with ``after_seq=next_after_seq``.

A key limited to some queues sees only the events of those queues; a page holds at most
``max_page_bytes`` of stored results; both can end a page early with a ``next_cursor``
(orbit/event_pages.py).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import events
from orbit.errors import InvalidRequest
from orbit.event_pages import page_result_events
from orbit.http.auth import authorize
from orbit.http.body import query_int
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.storage.fairness import current_tenant
from orbit.types import Action


class EventPage(msgspec.Struct, frozen=True, kw_only=True):
    items: list[events.ResultEventOut]
    next_cursor: str | None
    next_after_seq: int


@api(
    "Result events of the namespace, in sequence order", responses={200: EventPage},
    errors=[400, 404, 429], action=Action.EVENTS_READ.value, tags=["events"],
    query=(
        QueryParam("after_seq", int, "return events with seq > after_seq (default 0)"),
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_events(request: Request) -> Response:
    request.app.state.ctx.list_bytes.refuse_early(current_tenant.get(), "events")  # before the key
    principal = await authorize(request, Action.EVENTS_READ.value, request.path_params["ns"])
    assert principal.namespace_id is not None
    limit = parse_limit(request.query_params.get("limit"))
    after = query_int(request, "after_seq", 0)
    position = decode_cursor(request.query_params.get("cursor"))
    if position is not None:
        seq = position.get("after_seq")
        if not isinstance(seq, int) or seq < 0:
            raise InvalidRequest("cursor is not valid", field="cursor")
        after = seq
    ctx = request.app.state.ctx
    items, last, more = await page_result_events(
        ctx.db, principal.namespace_id, after, limit, principal.queues,
        ctx.settings.max_page_bytes, ctx.list_bytes.charge_for(principal.application_id, "events"),
    )  # fmt: skip
    nxt = encode_cursor({"after_seq": last}) if more else None
    return json_response(
        EventPage(items=[e.to_wire() for e in items], next_cursor=nxt, next_after_seq=last)
    )


def routes() -> list[Route]:
    return [Route("/v1/namespaces/{ns}/events", list_events, methods=["GET"])]
