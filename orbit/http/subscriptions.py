"""Subscription and delivery routes (docs/api/subscriptions.md).

Mount with ``Starlette(routes=[..., *subscriptions.ROUTES])`` (or ``routes()``), and start
:class:`orbit.delivery_loop.DeliveryLoop` as a background task. Handlers decode, authorise
and translate; the rules live in :mod:`orbit.subscriptions` and :mod:`orbit.deliveries`.

Actions: ``subscriptions.manage`` for PUT and ``/budget``; ``subscriptions.consume`` for the
stream, pull, ack, nack; GET (config + backlog) and the delivery history accept either.

A key limited to some queues reaches only subscriptions whose filter names queues, all of
them allowed (``orbit.subscriptions.visible_to``): others answer 404 on every route, and a
PUT must name allowed queues in ``filter.queues`` (403 otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, TypeVar

import msgspec
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.credentials import Principal
from orbit.deliveries import DeliveryOut, delivery_info, delivery_out
from orbit.delivery_budget import handed_out_bytes
from orbit.delivery_loop import DeliveryHub
from orbit.errors import InvalidRequest, NotFound
from orbit.http.auditing import ACK_ACTION, NACK_ACTION, audit_intent, request_id
from orbit.http.auth import authenticated, authorize
from orbit.http.body import decode_body, decode_optional, read_body
from orbit.http.etag import etag, preconditions
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.http.subscription_stream import StreamConnection
from orbit.ids import parse_id
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.storage.fairness import current_tenant
from orbit.subscriptions import (
    CONSUME,
    MANAGE,
    SubscriptionOut,
    SubscriptionPut,
    subscription_out,
)

#: Longest a pull may wait for deliveries, and its largest batch.
MAX_PULL_WAIT_MS = 30_000
MAX_PULL = 500
#: While a pull waits, it re-checks at least this often (wake-ups from this node come sooner).
PULL_POLL_S = 0.25

T = TypeVar("T")
TAGS = ["subscriptions"]


class PullBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max: Annotated[int, msgspec.Meta(ge=1, le=MAX_PULL)] = 10
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_PULL_WAIT_MS)] = 0


class PullOut(msgspec.Struct, frozen=True, kw_only=True):
    deliveries: list[DeliveryOut]


class ProofBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    proof: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class NackBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    proof: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    #: 0..MAX_RETRY_AFTER_MS, checked by the nack (the bounds are stated for the document).
    retry_after_ms: (
        Annotated[
            int,
            msgspec.Meta(
                extra_json_schema={"minimum": 0, "maximum": deliveries.MAX_RETRY_AFTER_MS}
            ),
        ]
        | None
    ) = None


class BudgetBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: 1..MAX_BUDGET_ADD, checked by the budget service (the bounds are stated for the document).
    add: Annotated[
        int, msgspec.Meta(extra_json_schema={"minimum": 1, "maximum": deliveries.MAX_BUDGET_ADD})
    ]


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    items: list[deliveries.DeliveryInfo]
    next_cursor: str | None


def _hub(conn: HTTPConnection) -> DeliveryHub:
    hub: DeliveryHub = conn.app.state.ctx.delivery_hub
    return hub


async def _authorize_either(conn: HTTPConnection, ns: str) -> Principal:
    """Authorise with ``subscriptions.consume`` or, lacking it, ``subscriptions.manage``."""
    principal = await authenticated(conn)
    action = CONSUME if principal.may(CONSUME) or not principal.may(MANAGE) else MANAGE
    return await authorize(conn, action, ns)


async def _optional_body(request: Request, type_: type[T], default: T) -> T:
    """Decode the body; an empty body means ``default`` (every field at its default)."""
    ctx = request.app.state.ctx
    return decode_optional(
        await read_body(request), type_, default, max_depth=ctx.settings.max_json_depth
    )


def _namespace(p: Principal) -> bytes:
    assert p.namespace_id is not None
    return p.namespace_id


async def _check_delivery(conn: HTTPConnection, p: Principal, delivery_id: bytes) -> None:
    """A key limited to some queues reaches only deliveries of subscriptions it may see."""
    await subscriptions.check_delivery_visible(
        conn.app.state.ctx.db, _namespace(p), delivery_id, p.queues
    )


def _delivery_id(conn: HTTPConnection) -> bytes:
    delivery_id = parse_id(conn.path_params["id"])
    if delivery_id is None:
        raise NotFound("delivery")
    return delivery_id


# ----------------------------------------------------------------------------- subscriptions


@api(
    "Create or update a subscription", body=SubscriptionPut,
    responses={201: SubscriptionOut, 200: SubscriptionOut}, errors=[400, 404, 409, 412, 429],
    action=MANAGE, etag=True, tags=TAGS,
)  # fmt: skip
async def put_subscription(request: Request) -> Response:
    ns, name = request.path_params["ns"], request.path_params["name"]
    p = await authorize(request, MANAGE, ns)
    audit_intent(request, subscriptions.PUT_ACTION, "subscription", name, _namespace(p))
    body = await _optional_body(request, SubscriptionPut, SubscriptionPut())
    row, created, _ = await subscriptions.put_subscription(
        request.app.state.ctx.db,
        p.actor,
        _namespace(p),
        name,
        body,
        precondition=preconditions(request).check,
        request_id=request_id(request),
        allowed_queues=p.queues,
    )
    return json_response(
        subscription_out(row), 201 if created else 200, {"ETag": etag(row.revision)}
    )


@api(
    "A subscription with its backlog counts", responses={200: SubscriptionOut}, errors=[404],
    action=f"{CONSUME} or {MANAGE}", etag=True, tags=TAGS,
)  # fmt: skip
async def get_subscription(request: Request) -> Response:
    ns, name = request.path_params["ns"], request.path_params["name"]
    p = await _authorize_either(request, ns)
    row, backlog = await subscriptions.get_subscription_with_backlog(
        request.app.state.ctx.db, _namespace(p), name, p.queues
    )
    return json_response(subscription_out(row, backlog), 200, {"ETag": etag(row.revision)})


@api(
    "Delivery history of a subscription, in sequence order", responses={200: HistoryPage},
    errors=[400, 404], action=f"{CONSUME} or {MANAGE}", tags=TAGS,
    query=[QueryParam("state", str, "PENDING, LEASED, ACKED or EXHAUSTED"),
           QueryParam("limit", int, "1-500, default 50"), QueryParam("cursor", str)],
)  # fmt: skip
async def list_deliveries(request: Request) -> Response:
    ns, name = request.path_params["ns"], request.path_params["name"]
    p = await _authorize_either(request, ns)
    db = request.app.state.ctx.db
    state = request.query_params.get("state") or None
    limit = parse_limit(request.query_params.get("limit"))
    filters = {"subscription": name, "state": state}
    position = decode_cursor(request.query_params.get("cursor"), filters)
    after = position.get("seq", 0) if position else 0
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise InvalidRequest("cursor is not valid", field="cursor")
    sub = await subscriptions.get_subscription(db, _namespace(p), name, p.queues)
    rows = await delivery_history.list_history(
        db, _namespace(p), sub.id, state=state, after_seq=after, limit=limit
    )
    cursor = encode_cursor({"seq": rows[-1].seq}, filters) if len(rows) == limit else None
    return json_response(HistoryPage(items=[delivery_info(r) for r in rows], next_cursor=cursor))


# ----------------------------------------------------------------------------- pull, ack, nack


@api(
    "Lease deliveries over HTTP (long poll)", body=PullBody, responses={200: PullOut},
    errors=[400, 404, 429], action=CONSUME, tags=TAGS,
)  # fmt: skip
async def pull(request: Request) -> Response:
    """Lease up to ``max`` deliveries, past the first no more than ``max_page_bytes`` of
    stored results (the rest stay for the next pull); when none is due, wait up to
    ``wait_ms`` for one. The bytes handed out are paid from the application's list-bytes
    budget afterwards; while it is in debt a pull is 429 before anything is leased."""
    ns, name = request.path_params["ns"], request.path_params["name"]
    ctx = request.app.state.ctx
    ctx.list_bytes.refuse_early(current_tenant.get(), "pulls")  # before the key is checked
    p = await authorize(request, CONSUME, ns)
    body = await _optional_body(request, PullBody, PullBody())
    db = ctx.db
    sub = await subscriptions.get_subscription(db, _namespace(p), name, p.queues)
    rate = ctx.list_bytes
    rate.check(p.application_id)  # 429 while earlier hand-outs are not paid for
    hub = _hub(request)
    wake = hub.watch(sub.namespace_id, sub.id)
    deadline = time.monotonic() + body.wait_ms / 1000.0
    try:
        while True:
            wake.clear()
            batch = await delivery_pump.lease(
                db, sub.namespace_id, sub.id, body.max, max_bytes=ctx.settings.max_page_bytes,
                probes=hub.lease_probes(db), rounds=hub.hand_out_round(db),
            )  # fmt: skip
            remaining = deadline - time.monotonic()
            if batch.deliveries or remaining <= 0:
                break
            if batch.behind:  # events were read and skipped by the filter: go on at once
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, PULL_POLL_S)):
                    await wake.wait()
    finally:
        hub.unwatch(sub.namespace_id, sub.id, wake)
    rate.spend(p.application_id, handed_out_bytes(batch.deliveries))
    return json_response(PullOut(deliveries=[delivery_out(d) for d in batch.deliveries]))


@api(
    "Acknowledge a delivery with its proof (idempotent)", body=ProofBody,
    responses={200: deliveries.AckResult}, errors=[400, 404, 409], action=CONSUME, tags=TAGS,
)  # fmt: skip
async def ack_delivery(request: Request) -> Response:
    p = await authorize(request, CONSUME, request.path_params["ns"])
    delivery_id = _delivery_id(request)
    audit_intent(request, ACK_ACTION, "delivery", delivery_id, _namespace(p))  # if it fails
    body = await decode_body(request, ProofBody)
    await _check_delivery(request, p, delivery_id)
    acks = _hub(request).ack_round(request.app.state.ctx.db)  # this node's round of acks
    result = await acks.submit(deliveries.AckItem(_namespace(p), delivery_id, body.proof))
    return json_response(result)


@api(
    "Give a delivery back for redelivery", body=NackBody,
    responses={200: deliveries.DeliveryInfo}, errors=[400, 404, 409], action=CONSUME, tags=TAGS,
)  # fmt: skip
async def nack_delivery(request: Request) -> Response:
    p = await authorize(request, CONSUME, request.path_params["ns"])
    delivery_id = _delivery_id(request)
    audit_intent(request, NACK_ACTION, "delivery", delivery_id, _namespace(p))  # if it fails
    body = await decode_body(request, NackBody)
    await _check_delivery(request, p, delivery_id)
    info = await deliveries.nack(
        request.app.state.ctx.db, _namespace(p), delivery_id, body.proof, body.retry_after_ms
    )
    _hub(request).notify_namespace(_namespace(p))
    return json_response(info)


@api(
    "Add attempt budget to a delivery (revives an EXHAUSTED one)", body=BudgetBody,
    responses={200: deliveries.DeliveryInfo}, errors=[400, 404, 422], action=MANAGE,
    idempotent=True, tags=TAGS,
)  # fmt: skip
async def add_budget(request: Request) -> Response:
    """Accepts ``Idempotency-Key``: a retried request replays the first answer instead of
    adding the budget twice."""
    p = await authorize(request, MANAGE, request.path_params["ns"])
    delivery_id = _delivery_id(request)
    audit_intent(request, deliveries.BUDGET_ACTION, "delivery", delivery_id, _namespace(p))
    body = await decode_body(request, BudgetBody)
    await _check_delivery(request, p, delivery_id)
    reply = await delivery_history.add_budget_reply(
        request.app.state.ctx.db,
        _namespace(p),
        delivery_id,
        body.add,
        actor=p.actor,
        request_id=request_id(request),
        idem=await idem_request(request),
    )
    if not reply.replayed:
        _hub(request).notify_namespace(_namespace(p))
    return reply_response(reply)


# ----------------------------------------------------------------------------- stream


@api(
    "Subscription WebSocket: push deliveries, take ack/nack frames", action=CONSUME, tags=TAGS,
)  # fmt: skip
async def stream(ws: WebSocket) -> None:
    """The subscription WebSocket (see :mod:`orbit.http.subscription_stream`).

    Authorised before the upgrade is accepted: a bad key closes with 4401, a missing
    action with 4403, an unknown namespace or subscription with 4404.
    """
    ns, name = ws.path_params["ns"], ws.path_params["name"]
    p = await authorize(ws, CONSUME, ns)
    ctx = ws.app.state.ctx
    sub = await subscriptions.get_subscription(ctx.db, _namespace(p), name, p.queues)
    await ws.accept()
    streams = ctx.streams
    conn = StreamConnection(
        ws,
        ctx.db,
        ctx.delivery_hub,
        sub,
        streams.options,
        max_bytes=ctx.settings.max_page_bytes,
        rate=(ctx.list_bytes, p.application_id),
    )
    streams.live.add(conn)
    try:
        await conn.run()
    finally:
        streams.live.discard(conn)


def routes() -> list[BaseRoute]:
    """Every route of this module, to mount at the application root."""
    base = "/v1/namespaces/{ns}"
    return [
        Route(f"{base}/subscriptions/{{name}}", put_subscription, methods=["PUT"]),
        Route(f"{base}/subscriptions/{{name}}", get_subscription, methods=["GET"]),
        WebSocketRoute(f"{base}/subscriptions/{{name}}/stream", stream),
        Route(f"{base}/subscriptions/{{name}}/pull", pull, methods=["POST"]),
        Route(f"{base}/subscriptions/{{name}}/deliveries", list_deliveries, methods=["GET"]),
        Route(f"{base}/deliveries/{{id}}/ack", ack_delivery, methods=["POST"]),
        Route(f"{base}/deliveries/{{id}}/nack", nack_delivery, methods=["POST"]),
        Route(f"{base}/deliveries/{{id}}/budget", add_budget, methods=["POST"]),
    ]


ROUTES = routes()
