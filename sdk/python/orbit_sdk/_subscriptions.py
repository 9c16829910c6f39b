"""``client.subscriptions`` (configure, pull, ack, nack, delivery history, budget) and
``client.events`` (the namespace's result events by sequence, one page or all of them).

For a long-running consumer prefer :class:`~orbit_sdk.Subscriber` (WebSocket push with
reconnects); these calls are the HTTP building blocks and the operator's tools.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from . import _json
from ._http import HttpTransport, seg
from ._requests import conditional_headers, decode_resource, iterate_pages
from ._tasks import decode_items, idempotency_headers
from .subscription_types import (
    AckResult,
    DeliveryInfo,
    PulledDelivery,
    StartPosition,
    Subscription,
    SubscriptionFilter,
)
from .types import Event, EventPage, Page

__all__ = ["EventsAPI", "SubscriptionsAPI"]


class _SubscriptionPut(msgspec.Struct, kw_only=True):
    """Body of ``PUT .../subscriptions/{name}``; unset fields are left out."""

    filter: SubscriptionFilter | UnsetType = UNSET
    start: Any = UNSET
    ack_timeout_ms: int | UnsetType = UNSET
    max_deliveries: int | UnsetType = UNSET
    max_in_flight: int | UnsetType = UNSET


class _Pulled(msgspec.Struct):
    deliveries: builtins.list[PulledDelivery] = msgspec.field(default_factory=builtins.list)


def _start(start: StartPosition | Mapping[str, int]) -> Any:
    if isinstance(start, bool):
        raise TypeError("start is 'earliest', 'latest' or a sequence number")
    if isinstance(start, int):
        return {"after_seq": start}
    if isinstance(start, Mapping):
        return dict(start)
    return start


class SubscriptionsAPI:
    """Subscriptions and deliveries of the client's namespace."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _sub(self, name: str, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/subscriptions/{seg(name)}{suffix}"

    def _delivery(self, delivery_id: str, verb: str) -> str:
        return f"/v1/namespaces/{seg(self._ns())}/deliveries/{seg(delivery_id)}/{verb}"

    async def put(
        self,
        name: str,
        *,
        filter: SubscriptionFilter | Mapping[str, Any] | None = None,
        start: StartPosition | Mapping[str, int] | None = None,
        ack_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        max_in_flight: int | None = None,
        if_match: str | int | None = None,
        create_only: bool = False,
    ) -> Subscription:
        """Create (``created=True``) or update a subscription; returns it with its ``etag``.

        Omitted settings take their defaults on create and keep their value on update.
        ``start`` (``"earliest"``, ``"latest"`` — the default — or a sequence number to
        start after) applies only on create; a different one later raises
        :class:`~orbit_sdk.errors.Conflict`. ``if_match`` / ``create_only`` make the PUT
        conditional (:class:`~orbit_sdk.errors.PreconditionFailed`).
        """
        body = _SubscriptionPut()
        if filter is not None:
            body.filter = (
                filter
                if isinstance(filter, SubscriptionFilter)
                else msgspec.convert(dict(filter), SubscriptionFilter)
            )
        if start is not None:
            body.start = _start(start)
        if ack_timeout_ms is not None:
            body.ack_timeout_ms = ack_timeout_ms
        if max_deliveries is not None:
            body.max_deliveries = max_deliveries
        if max_in_flight is not None:
            body.max_in_flight = max_in_flight
        response = await self._http.request(
            "PUT", self._sub(name), body=body, headers=conditional_headers(if_match, create_only)
        )
        return decode_resource(response, Subscription)

    async def get(self, name: str) -> Subscription:
        """The subscription's configuration, scan position, ``backlog`` and ``etag``."""
        return decode_resource(await self._http.request("GET", self._sub(name)), Subscription)

    async def delete(self, name: str, *, if_match: str | int | None = None) -> None:
        """Delete the subscription: its streams end and nothing more is delivered; its
        delivery history stays. The name can be used again (a new start position)."""
        await self._http.request(
            "DELETE", self._sub(name), headers=conditional_headers(if_match)
        )

    async def pull(
        self, name: str, *, max: int | None = None, wait_ms: int | None = None
    ) -> builtins.list[PulledDelivery]:
        """Lease up to ``max`` due deliveries (server default 10, at most 500); when none is
        due, wait up to ``wait_ms`` (at most 30 000) for one. Ack each with its proof before
        its ``lease_expires_at``, or it is handed out again."""
        body = {k: v for k, v in (("max", max), ("wait_ms", wait_ms)) if v is not None}
        response = await self._http.request("POST", self._sub(name, "/pull"), body=body)
        return _json.decode(response.content, _Pulled).deliveries

    async def ack(self, delivery_id: str, proof: str) -> AckResult:
        """Acknowledge a delivery with the proof of its latest hand-out. Idempotent
        (``outcome == "replayed"`` the second time). A wrong or superseded proof raises
        :class:`~orbit_sdk.errors.StaleProof`."""
        return await self._http.call(
            "POST", self._delivery(delivery_id, "ack"), AckResult, body={"proof": proof}
        )

    async def nack(
        self, delivery_id: str, proof: str, *, retry_after_ms: int | None = None
    ) -> DeliveryInfo:
        """Give a delivery back: PENDING again after ``retry_after_ms`` (default: the
        server's backoff), or EXHAUSTED when its budget is spent. Nacking an acked delivery
        raises :class:`~orbit_sdk.errors.Conflict`."""
        body: dict[str, Any] = {"proof": proof}
        if retry_after_ms is not None:
            body["retry_after_ms"] = retry_after_ms
        return await self._http.call(
            "POST", self._delivery(delivery_id, "nack"), DeliveryInfo, body=body
        )

    async def deliveries(
        self,
        name: str,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[DeliveryInfo]:
        """One page of the subscription's delivery history in sequence order; ``state``
        filters (PENDING, LEASED, ACKED, EXHAUSTED)."""
        response = await self._http.request(
            "GET",
            self._sub(name, "/deliveries"),
            params={"state": state, "limit": limit, "cursor": cursor},
        )
        return decode_items(response.content, DeliveryInfo)

    def iter_deliveries(
        self, name: str, *, state: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[DeliveryInfo]:
        """Every delivery of the subscription (optionally in one state), in sequence order."""
        return iterate_pages(
            lambda cursor: self.deliveries(name, state=state, limit=page_size, cursor=cursor)
        )

    async def add_budget(
        self, delivery_id: str, add: int, *, idempotency_key: str | None = None
    ) -> DeliveryInfo:
        """Raise a delivery's attempt budget by ``add`` (1–1000); an EXHAUSTED delivery
        becomes PENDING, due at once, its history kept. Adding is not idempotent by itself:
        pass ``idempotency_key`` so a retried call replays the first answer."""
        return await self._http.call(
            "POST",
            self._delivery(delivery_id, "budget"),
            DeliveryInfo,
            body={"add": add},
            headers=idempotency_headers(idempotency_key),
        )


class EventsAPI:
    """Result events of the client's namespace (``GET /v1/namespaces/{ns}/events``), needing
    the ``events.read`` action. For delivery with acks and redelivery use a subscription."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    async def list(
        self, *, after_seq: int = 0, limit: int | None = None, cursor: str | None = None
    ) -> EventPage:
        """One page of events with ``seq > after_seq`` (or from ``cursor``), in order.
        ``next_after_seq`` is the seq of the last item (or ``after_seq`` when empty)."""
        params = {"after_seq": None if cursor else after_seq, "limit": limit, "cursor": cursor}
        response = await self._http.request(
            "GET", f"/v1/namespaces/{seg(self._ns())}/events", params=params
        )
        page = _json.decode(response.content, EventPage)
        if page.next_after_seq is None:
            page.next_after_seq = page.items[-1].seq if page.items else after_seq
        return page

    async def iter(
        self,
        *,
        after_seq: int = 0,
        page_size: int | None = None,
        follow: bool = False,
        interval: float = 1.0,
    ) -> AsyncIterator[Event]:
        """Every event with ``seq > after_seq``, in sequence order. Without ``follow`` it
        ends at the last committed event; with ``follow`` it keeps polling every
        ``interval`` seconds for new ones (stop by breaking out of the loop).

        Resume after a restart by passing the ``seq`` of the last event you processed.
        """
        position = after_seq
        while True:
            page = await self.list(after_seq=position, limit=page_size)
            for event in page.items:
                position = event.seq
                yield event
            if page.next_cursor:
                continue  # a full page: more may be waiting right now
            if not follow:
                return
            await asyncio.sleep(interval)
