"""Receive result events through a subscription: :class:`Subscriber` (async, WebSocket) and
:class:`SyncSubscriber` (blocking, HTTP pull).

::

    async with Subscriber(url, key, "prod", "billing") as sub:
        async for delivery in sub:
            await handle(delivery.event)      # make this idempotent (see below)
            await delivery.ack()

Delivery is **at-least-once**: a delivery whose ack is lost (connection drop, crash, lease
expiry) comes again, with the same ``delivery_id`` and ``event_id`` and a new proof. Make the
effect exactly-once on your side by recording ``event_id`` in the same transaction as the
effect (docs/examples/inbox/ shows the pattern).

Reconnects are automatic, with exponential backoff and jitter; the server keeps the
subscription's position, so nothing is skipped: deliveries not acked on a connection that
closed are given back at once and arrive again on the next one. A key or subscription the
server refuses (401/403/404) ends the iteration with that error. API keys and delivery
proofs are never logged (``repr`` of a :class:`Delivery` omits the proof).

Flow control is the server's: it never has more than the subscription's ``max_in_flight``
deliveries unacked, so the local buffer is bounded by it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from . import _json
from ._backoff import Backoff
from ._connection import _ws_logger
from ._endpoints import Endpoints, ws_url
from ._http import HttpTransport, seg
from ._version import USER_AGENT
from .errors import (
    Conflict,
    Forbidden,
    NotFound,
    OrbitConnectionError,
    OrbitError,
    Unauthenticated,
    error_from_response,
)
from .types import Event

__all__ = ["Delivery", "Subscriber", "SubscriberStats", "SyncDelivery", "SyncSubscriber"]

logger = logging.getLogger("orbit_sdk.subscriber")

_MAX_FRAME = 32 * 1024 * 1024
#: WebSocket close codes (4000 + HTTP status) that mean "do not reconnect".
_FATAL_CLOSE = {4401: Unauthenticated, 4403: Forbidden, 4404: NotFound}
_FATAL_STATUS = {401: Unauthenticated, 403: Forbidden, 404: NotFound}


# ----------------------------------------------------------------------------- wire


class DeliveryFrame(msgspec.Struct, tag="delivery", tag_field="type", kw_only=True):
    """Server → client: one hand-out of a delivery."""

    delivery_id: str
    seq: int
    event_id: str
    proof: str
    event: msgspec.Raw
    attempt: int = 1
    lease_expires_at: str | None = None


class ErrorFrame(msgspec.Struct, tag="error", tag_field="type", kw_only=True):
    """Server → client: an ack or nack failed (``ref`` is the delivery id) or a bad frame."""

    code: str
    message: str = ""
    ref: str | None = None


class PingFrame(msgspec.Struct, tag="ping", tag_field="type"):
    pass


class PongFrame(msgspec.Struct, tag="pong", tag_field="type"):
    pass


class AckFrame(msgspec.Struct, tag="ack", tag_field="type", kw_only=True):
    delivery_id: str
    proof: str


class NackFrame(msgspec.Struct, tag="nack", tag_field="type", kw_only=True, omit_defaults=True):
    delivery_id: str
    proof: str
    retry_after_ms: int | None = None


ServerFrame = DeliveryFrame | ErrorFrame | PingFrame | PongFrame
SERVER_DECODER = msgspec.json.Decoder(ServerFrame, float_hook=_json.number)
_ENCODER = _json.ENCODER


class _FrameType(msgspec.Struct):
    type: str = ""


def encode(frame: AckFrame | NackFrame | PingFrame | PongFrame) -> bytes:
    return _ENCODER.encode(frame)


# ----------------------------------------------------------------------------- delivery


class _Settler:
    """Where a delivery's ack/nack goes: the connection it came on, else HTTP."""

    async def settle(self, d: Delivery, frame: AckFrame | NackFrame) -> bool:  # pragma: no cover
        raise NotImplementedError


class Delivery:
    """One hand-out of a result event. Call :meth:`ack` once the effect is committed.

    ``attempt`` counts hand-outs of this delivery (2 or more means a redelivery).
    """

    __slots__ = (
        "_epoch", "_event", "_proof", "_settler", "attempt", "delivery_id", "event_id",
        "lease_expires_at", "raw_event", "seq",
    )  # fmt: skip

    def __init__(self, frame: DeliveryFrame, settler: _Settler, epoch: int) -> None:
        self.delivery_id = frame.delivery_id
        self.seq = frame.seq
        self.event_id = frame.event_id
        self.attempt = frame.attempt
        self.lease_expires_at = frame.lease_expires_at
        self.raw_event = bytes(frame.event)
        self._proof = frame.proof
        self._settler = settler
        self._epoch = epoch
        self._event: Event | None = None

    def __repr__(self) -> str:
        return (
            f"Delivery(delivery_id={self.delivery_id!r}, seq={self.seq}, "
            f"event_id={self.event_id!r}, attempt={self.attempt})"
        )

    @property
    def event(self) -> Event:
        """The event snapshot (``seq``, ``type``, ``task_id``, ``state``, ``result``, ...)."""
        if self._event is None:
            self._event = _json.decode(self.raw_event, Event)
        return self._event

    async def ack(self) -> bool:
        """Acknowledge. True when sent (WebSocket: no reply comes) or applied (HTTP); False
        when the server answered that the proof is stale: the delivery was handed out again
        (it will arrive again, de-duplicate it by ``event_id``)."""
        return await self._settler.settle(
            self, AckFrame(delivery_id=self.delivery_id, proof=self._proof)
        )

    async def nack(self, retry_after_ms: int | None = None) -> bool:
        """Give it back for redelivery after ``retry_after_ms`` (default: server backoff)."""
        frame = NackFrame(
            delivery_id=self.delivery_id, proof=self._proof, retry_after_ms=retry_after_ms
        )
        return await self._settler.settle(self, frame)


@dataclass
class SubscriberStats:
    """Counters of a subscriber (safe to log: no secrets)."""

    connects: int = 0
    deliveries: int = 0
    redeliveries: int = 0  # deliveries with attempt > 1
    acks: int = 0
    nacks: int = 0
    stale: int = 0  # acks/nacks the server refused with stale_proof
    errors: int = 0  # other error frames
    dropped: int = 0  # buffered deliveries dropped on a disconnect (they come again)


def _ws_url(base: str, namespace: str, subscription: str) -> str:
    return f"{ws_url(base)}/v1/namespaces/{seg(namespace)}/subscriptions/{seg(subscription)}/stream"


class Subscriber(_Settler):
    """Async iterator over the deliveries of one subscription, over a WebSocket.

    ``url`` is the server's base URL (``http://host:8080``), or several nodes' (a list, or
    one string with commas): when the node in use cannot be reached or drops the stream, the
    next one is tried at once, and the backoff applies only after a whole round failed.
    ``key`` is an API key with ``subscriptions.consume`` on ``namespace``.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        key: str,
        namespace: str,
        subscription: str,
        *,
        backoff: Backoff | None = None,
        open_timeout: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoints = Endpoints(url)
        self.namespace = namespace
        self.subscription = subscription
        self.stats = SubscriberStats()
        self._key = key
        self._backoff = backoff or Backoff(initial=0.1, maximum=10.0)
        self._open_timeout = open_timeout
        self._http = HttpTransport(self.endpoints, key, http=http)
        self._untried = len(self.endpoints)
        self._node_left = False
        self._buffer: asyncio.Queue[Delivery | BaseException] = asyncio.Queue()
        self._ws: ClientConnection | None = None
        self._epoch = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"Subscriber({self.url!r}, namespace={self.namespace!r}, subscription={self.subscription!r})"

    @property
    def url(self) -> str:
        """The base URL in use (of several, the node that last worked)."""
        return self.endpoints.current

    # -- lifecycle

    async def start(self) -> None:
        """Open the stream in the background (iteration calls it on first use)."""
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name="orbit-subscriber")

    async def aclose(self) -> None:
        """Stop: close the WebSocket (the server gives unacked deliveries back at once)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._http.aclose()
        self._buffer.put_nowait(StopAsyncIteration())

    async def __aenter__(self) -> Subscriber:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Subscriber:
        return self

    async def __anext__(self) -> Delivery:
        if self._closed and self._buffer.empty():
            raise StopAsyncIteration
        await self.start()
        while True:
            item = await self._buffer.get()
            if isinstance(item, StopAsyncIteration):
                raise StopAsyncIteration
            if isinstance(item, BaseException):
                self._closed = True
                raise item
            if item._epoch == self._epoch:  # stale ones were given back by the server
                return item

    @property
    def connected(self) -> bool:
        return self._ws is not None

    # -- connection

    async def _run(self) -> None:
        while not self._closed:
            node = self.url
            failed = False
            try:
                await self._serve(_ws_url(node, self.namespace, self.subscription))
            except OrbitError as exc:  # refused for good: end the iteration with it
                logger.error("subscription stream refused: %s", exc.code)
                self._buffer.put_nowait(exc)
                return
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
                logger.warning("subscription stream unavailable: %s", type(exc).__name__)
                failed = True
            if self._closed:
                return
            if (failed or self._node_left) and self._next_node(node):
                continue  # another node at once: the backoff waits for a whole round
            await asyncio.sleep(self._backoff.next_delay())

    def _next_node(self, failed: str) -> bool:
        """Move to the next of several base URLs; True when it is untried in this round."""
        self._node_left = False
        if not self.endpoints.failed(failed):
            return False
        if self._untried > 1:
            self._untried -= 1
            return True
        self._untried = len(self.endpoints)
        return False

    async def _serve(self, url: str) -> None:
        try:
            ws = await connect(
                url,
                additional_headers={"Authorization": f"Bearer {self._key}"},
                user_agent_header=USER_AGENT,
                open_timeout=self._open_timeout,
                max_size=_MAX_FRAME,
                compression=None,
                logger=_ws_logger,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in _FATAL_STATUS:
                raise error_from_response(
                    status, bytes(exc.response.body or b""), exc.response.headers
                ) from None
            raise
        self._epoch += 1
        self._ws = ws
        self.stats.connects += 1
        self._untried = len(self.endpoints)
        logger.info("subscription stream open (%s/%s)", self.namespace, self.subscription)
        try:
            first = True
            async for raw in ws:
                if first:
                    self._backoff.reset()
                    first = False
                await self._dispatch(ws, raw if isinstance(raw, bytes) else raw.encode())
        except ConnectionClosed:
            pass
        finally:
            self._ws = None
            self._drop_buffered()
            with contextlib.suppress(Exception):
                await ws.close()
        rcvd = ws.close_code
        if rcvd in _FATAL_CLOSE:
            raise _FATAL_CLOSE[rcvd](ws.close_reason or "refused", status=rcvd - 4000)
        # No close frame, or "going away" / "service restart": the node left.
        self._node_left = rcvd in (None, 1001, 1006, 1012)
        logger.warning("subscription stream closed (code %s); reconnecting", rcvd)

    def _drop_buffered(self) -> None:
        """Deliveries buffered but not yet yielded belong to the closed connection: the
        server gives them back, so they will come again on the next connection."""
        kept: list[Delivery | BaseException] = []
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, Delivery):
                self.stats.dropped += 1
            else:
                kept.append(item)
        for item in kept:
            self._buffer.put_nowait(item)

    async def _dispatch(self, ws: ClientConnection, raw: bytes) -> None:
        try:
            frame = SERVER_DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            kind = "<not JSON>"
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                kind = msgspec.json.decode(raw, type=_FrameType).type
            logger.debug("ignoring server frame of type %r", kind)
            return
        if isinstance(frame, DeliveryFrame):
            self.stats.deliveries += 1
            if frame.attempt > 1:
                self.stats.redeliveries += 1
            self._buffer.put_nowait(Delivery(frame, self, self._epoch))
        elif isinstance(frame, PingFrame):
            await ws.send(encode(PongFrame()).decode())
        elif isinstance(frame, ErrorFrame):
            if frame.code == "stale_proof":
                self.stats.stale += 1
                logger.info("delivery %s: proof stale, it will be redelivered", frame.ref)
            else:
                self.stats.errors += 1
                logger.warning(
                    "subscription error %s for %s: %s", frame.code, frame.ref, frame.message
                )

    async def settle(self, d: Delivery, frame: AckFrame | NackFrame) -> bool:
        ws = self._ws
        if ws is not None and d._epoch == self._epoch:
            try:
                await ws.send(encode(frame).decode())
                self._count(frame)
                return True
            except ConnectionClosed:
                pass  # fall back to HTTP: the proof may still be current
        verb = "ack" if isinstance(frame, AckFrame) else "nack"
        body: dict[str, Any] = {"proof": frame.proof}
        if isinstance(frame, NackFrame) and frame.retry_after_ms is not None:
            body["retry_after_ms"] = frame.retry_after_ms
        path = f"/v1/namespaces/{seg(self.namespace)}/deliveries/{seg(d.delivery_id)}/{verb}"
        try:
            await self._http.request("POST", path, body=body)
        except Conflict as exc:
            if exc.code != "stale_proof":
                raise
            self.stats.stale += 1
            return False
        self._count(frame)
        return True

    def _count(self, frame: AckFrame | NackFrame) -> None:
        if isinstance(frame, AckFrame):
            self.stats.acks += 1
        else:
            self.stats.nacks += 1


# ----------------------------------------------------------------------------- sync facade


class SyncDelivery:
    """A delivery from :class:`SyncSubscriber`; :meth:`ack` / :meth:`nack` block."""

    __slots__ = ("_owner", "_proof", "attempt", "delivery_id", "event_id", "raw_event", "seq")

    def __init__(self, item: dict[str, Any], raw_event: bytes, owner: SyncSubscriber) -> None:
        self.delivery_id: str = item["delivery_id"]
        self.seq: int = item["seq"]
        self.event_id: str = item["event_id"]
        self.attempt: int = item.get("attempt", 1)
        self.raw_event = raw_event
        self._proof: str = item["proof"]
        self._owner = owner

    def __repr__(self) -> str:
        return f"SyncDelivery(delivery_id={self.delivery_id!r}, seq={self.seq}, attempt={self.attempt})"

    @property
    def event(self) -> Event:
        return _json.decode(self.raw_event, Event)

    def ack(self) -> bool:
        """True when applied; False when the proof is stale (it will be redelivered)."""
        return self._owner._settle(self, "ack", {"proof": self._proof})

    def nack(self, retry_after_ms: int | None = None) -> bool:
        body: dict[str, Any] = {"proof": self._proof}
        if retry_after_ms is not None:
            body["retry_after_ms"] = retry_after_ms
        return self._owner._settle(self, "nack", body)


class _PullItem(msgspec.Struct):
    delivery_id: str
    seq: int
    event_id: str
    proof: str
    event: msgspec.Raw
    attempt: int = 1


class _PullAnswer(msgspec.Struct):
    deliveries: list[_PullItem]


@dataclass
class SyncSubscriber:
    """Blocking iterator over a subscription's deliveries, using HTTP long-poll ``pull``.

    ``for delivery in SyncSubscriber(url, key, ns, name): ...; delivery.ack()``. Network
    errors are retried with backoff (nothing is lost: unacked deliveries come back when
    their lease expires). Iteration stops after :meth:`close` or a refused key (raised).
    """

    url: str | Sequence[str]
    key: str = field(repr=False)
    namespace: str
    subscription: str
    batch: int = 10
    wait_ms: int = 20_000
    timeout: float = 60.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=10.0))
    _client: httpx.Client | None = field(default=None, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    endpoints: Endpoints = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.endpoints = Endpoints(self.url)

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                timeout=self.timeout,
                headers={"Authorization": f"Bearer {self.key}", "User-Agent": USER_AGENT},
            )
        return self._client

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST to the node in use; a node that cannot be reached (or answers 503) passes
        the request to the next one at once (pull, ack and nack are safe to repeat: an
        unacked lease simply comes back, an ack is idempotent)."""
        content = _ENCODER.encode(body)
        nodes = list(self.endpoints.round())
        for i, base in enumerate(nodes):
            more = i + 1 < len(nodes)
            try:
                response = self._http().post(
                    base + path, content=content, headers={"Content-Type": "application/json"}
                )
            except httpx.TransportError as exc:
                if more:
                    self.endpoints.failed(base)
                    continue
                raise OrbitConnectionError(f"POST {path}: {type(exc).__name__}") from exc
            if response.status_code == 503 and more:
                self.endpoints.failed(base)
                continue
            if response.status_code >= 400:
                raise error_from_response(response.status_code, response.content, response.headers)
            return response
        raise AssertionError("unreachable: the last node answers or raises")  # pragma: no cover

    def pull(self, max: int | None = None, wait_ms: int | None = None) -> list[SyncDelivery]:
        """One long-poll: up to ``max`` deliveries, waiting up to ``wait_ms`` for the first."""
        path = f"/v1/namespaces/{seg(self.namespace)}/subscriptions/{seg(self.subscription)}/pull"
        body = {"max": max or self.batch, "wait_ms": self.wait_ms if wait_ms is None else wait_ms}
        answer = _json.decode(self._post(path, body).content, _PullAnswer)
        return [
            SyncDelivery(msgspec.structs.asdict(i), bytes(i.event), self) for i in answer.deliveries
        ]

    def __iter__(self) -> Iterator[SyncDelivery]:
        while not self._closed:
            try:
                batch = self.pull()
                self.backoff.reset()
            except OrbitConnectionError as exc:
                logger.warning("pull failed: %s; retrying", exc.code)
                time.sleep(self.backoff.next_delay())
                continue
            yield from batch

    def _settle(self, d: SyncDelivery, verb: str, body: dict[str, Any]) -> bool:
        path = f"/v1/namespaces/{seg(self.namespace)}/deliveries/{seg(d.delivery_id)}/{verb}"
        try:
            self._post(path, body)
        except Conflict as exc:
            if exc.code != "stale_proof":
                raise
            return False
        return True

    def close(self) -> None:
        self._closed = True
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> SyncSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
