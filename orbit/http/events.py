"""``GET /v1/namespaces/{ns}/events``: the namespace's result events by sequence.

Query: ``after_seq`` (default 0: from the start) or ``cursor`` (from a previous page), and
``limit`` (default 50, max 500). Needs the ``events.read`` action. Answer:
``{"items": [...], "next_cursor": ... | null, "next_after_seq": n}``; ``next_after_seq`` is
the seq of the last event looked at (or the ``after_seq`` asked for when none was), so a
poller can keep asking with ``after_seq=next_after_seq``.

A key limited to some queues sees only the events of those queues: the others are skipped.
To keep one request bounded, at most ``SCAN_FACTOR × limit`` events are looked at; a page
can then hold fewer than ``limit`` items with a ``next_cursor`` to go on from.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import events
from orbit.credentials import Principal
from orbit.errors import InvalidRequest
from orbit.http.auth import authorize
from orbit.http.body import query_int
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import json_response
from orbit.pagination import MAX_LIMIT, decode_cursor, encode_cursor, parse_limit
from orbit.types import Action

#: A queue-limited key's request looks at most this many times ``limit`` events.
SCAN_FACTOR = 10


class EventPage(msgspec.Struct, frozen=True, kw_only=True):
    items: list[events.ResultEventOut]
    next_cursor: str | None
    next_after_seq: int


@api(
    "Result events of the namespace, in sequence order", responses={200: EventPage},
    errors=[404], action=Action.EVENTS_READ.value, tags=["events"],
    query=(
        QueryParam("after_seq", int, "return events with seq > after_seq (default 0)"),
        QueryParam("limit", int, "page size, 1-500 (default 50)"),
        QueryParam("cursor", str, "next_cursor of the previous page"),
    ),
)  # fmt: skip
async def list_events(request: Request) -> Response:
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
    items, last, more = await _visible_events(request, principal, after, limit)
    nxt = encode_cursor({"after_seq": last}) if more else None
    return json_response(
        EventPage(items=[e.to_wire() for e in items], next_cursor=nxt, next_after_seq=last)
    )


async def _visible_events(
    request: Request, principal: Principal, after: int, limit: int
) -> tuple[list[events.ResultEvent], int, bool]:
    """(events the key may see, the last seq looked at, whether more may follow)."""
    db = request.app.state.ctx.db
    assert principal.namespace_id is not None
    queues = principal.queues
    items: list[events.ResultEvent] = []
    last = after
    budget = limit * (1 if queues is None else SCAN_FACTOR)
    while budget > 0:
        ask = min(budget, MAX_LIMIT)
        page = await events.list_result_events(db, principal.namespace_id, last, ask)
        budget -= len(page)
        for e in page:
            last = e.seq
            if queues is None or e.queue in queues:
                items.append(e)
                if len(items) == limit:
                    return items, last, True
        if len(page) < ask:
            return items, last, False
    return items, last, True


def routes() -> list[Route]:
    return [Route("/v1/namespaces/{ns}/events", list_events, methods=["GET"])]
