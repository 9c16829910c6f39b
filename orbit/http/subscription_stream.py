"""The subscription WebSocket: push deliveries with flow control, take acks and nacks.

``GET /v1/namespaces/{ns}/subscriptions/{name}/stream`` (docs/api/subscriptions.md). JSON text
frames, each with a ``type``:

| direction | type | fields |
| --- | --- | --- |
| server→client | ``delivery`` | ``delivery_id``, ``seq``, ``event_id``, ``proof``, ``event``, ``attempt``, ``lease_expires_at`` |
| client→server | ``ack`` | ``delivery_id``, ``proof`` — no reply when it works |
| client→server | ``nack`` | ``delivery_id``, ``proof``, ``retry_after_ms``? — no reply when it works |
| server→client | ``error`` | ``code``, ``message``, ``ref`` (the delivery id the error is about, or null) |
| both ways | ``ping`` / ``pong`` | keep-alive: answer a ``ping`` with a ``pong`` |

Guarantees of one connection:

* **Flow control.** Deliveries are leased through :func:`orbit.delivery_pump.lease`, which never
  lets more than ``max_in_flight`` deliveries of the subscription be leased at once (all
  connections and pulls together); this connection additionally never holds more unacked
  hand-outs than ``max_in_flight``.
* **Bounded memory / backpressure.** Outgoing frames go through one bounded queue
  (``max_in_flight`` + a few control slots). Deliveries are leased only into free slots; the
  sender awaits the transport (which blocks while the client does not read); error replies
  wait for a slot, so a client that floods frames without reading is no longer read from;
  pings are dropped when the queue is full. So a slow reader costs at most ``max_in_flight``
  frames, whatever the backlog. In bytes: one hand-out carries at most ``max_bytes`` of
  stored results (``settings.max_page_bytes``, 4 MiB; always at least one delivery), and no
  hand-out starts while the frames queued and not yet sent reach ``max_bytes``, so a slow
  reader of large results holds about two budgets of frames, not ``max_in_flight`` results.
  The bytes handed out are paid from the application's list-bytes budget
  (:mod:`orbit.list_bytes`); while it is in debt the next hand-out waits.
* **Keep-alive.** The server sends ``ping`` after ``ping_interval_s`` without sending; it
  closes the connection (code 4408) when nothing was received for ``idle_timeout_s``.
* **Group-committed acks.** Acks are queued (bounded: the receive loop waits when the queue
  is full) and applied by one task; the acks that arrive while a batch's transaction is in
  flight go together into the next one (:func:`orbit.deliveries.ack_many`, each judged
  alone). A nack first waits for the acks received before it; a closing connection applies
  the acks it received before releasing what it still holds.
* **Resume.** When the connection ends, its unacked deliveries are released at once (back to
  PENDING with no backoff; the attempt counted), so a reconnecting consumer gets them
  immediately. If the server process dies instead, they come back when their lease expires
  (``ack_timeout_ms``). Acked deliveries never come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketState

from orbit import deliveries, delivery_pump
from orbit.deliveries import AckItem, Leased, StaleProof, event_json
from orbit.delivery_budget import handed_out_bytes
from orbit.delivery_loop import DeliveryHub
from orbit.errors import InvalidRequest, NotFound, OrbitError
from orbit.http.auditing import settle_failure
from orbit.http.body import check_depth
from orbit.http.errors import client_error
from orbit.ids import id_hex, parse_id
from orbit.list_bytes import ListBytes
from orbit.pagination import MAX_PAGE_BYTES
from orbit.storage import Database, StorageError
from orbit.store.subscriptions import SubscriptionRow
from orbit.times import format_time

log = logging.getLogger("orbit.subscriptions.stream")

#: Queue slots kept for control frames (errors, pings, pongs) beyond max_in_flight.
CONTROL_SLOTS = 8
IDLE_CLOSE_CODE = 4408


def _storage_reply(exc: StorageError) -> tuple[str, str]:
    """(code, message) of the ``error`` frame for a storage failure: the client error the
    HTTP handler would answer (:func:`~orbit.http.errors.client_error`), else ``not_ready``
    (the consumer retries the ack or nack)."""
    err = client_error(exc)
    if err is None:
        return "not_ready", f"database busy, retry: {type(exc).__name__}"
    return err.code, err.message


# ----------------------------------------------------------------------------- frames


class DeliveryFrame(msgspec.Struct, tag="delivery", tag_field="type", kw_only=True):
    delivery_id: str
    seq: int
    event_id: str
    proof: str
    event: msgspec.Raw
    attempt: int
    lease_expires_at: str


class ErrorFrame(msgspec.Struct, tag="error", tag_field="type", kw_only=True):
    code: str
    message: str
    ref: str | None = None


class AckFrame(msgspec.Struct, tag="ack", tag_field="type", kw_only=True):
    delivery_id: str
    proof: str


class NackFrame(msgspec.Struct, tag="nack", tag_field="type", kw_only=True):
    delivery_id: str
    proof: str
    retry_after_ms: int | None = None


class PingFrame(msgspec.Struct, tag="ping", tag_field="type", kw_only=True):
    pass


class PongFrame(msgspec.Struct, tag="pong", tag_field="type", kw_only=True):
    pass


ClientFrame = AckFrame | NackFrame | PingFrame | PongFrame
_DECODE_CLIENT = msgspec.json.Decoder(ClientFrame)
_ENCODE = msgspec.json.Encoder()
_PING = _ENCODE.encode(PingFrame()).decode()
_PONG = _ENCODE.encode(PongFrame()).decode()


def delivery_frame(d: Leased) -> str:
    return _ENCODE.encode(
        DeliveryFrame(
            delivery_id=id_hex(d.delivery_id),
            seq=d.seq,
            event_id=id_hex(d.event_id),
            proof=d.proof,
            event=event_json(d.event),
            attempt=d.attempt,
            lease_expires_at=format_time(d.lease_expires_at),
        )
    ).decode()


def error_frame(code: str, message: str, ref: str | None = None) -> str:
    return _ENCODE.encode(ErrorFrame(code=code, message=message, ref=ref)).decode()


# ----------------------------------------------------------------------------- connection


@dataclass
class StreamStats:
    """Counters of one connection (tests and metrics read them)."""

    leased: int = 0  # deliveries handed out to this connection
    sent: int = 0  # frames written to the socket
    acked: int = 0
    nacked: int = 0
    errors: int = 0  # error frames queued
    pings_dropped: int = 0  # pings not queued because the queue was full
    max_queue: int = 0  # high-water mark of the send queue
    max_unacked: int = 0  # high-water mark of unacked hand-outs
    released: int = 0  # deliveries given back when the connection ended
    throttled: int = 0  # hand-outs delayed for the application's byte budget
    drain_waits: int = 0  # hand-outs delayed until the queued frames' bytes are sent


@dataclass
class StreamOptions:
    ping_interval_s: float = 20.0
    idle_timeout_s: float = 60.0
    #: Safety re-check when idle and nothing else wakes the stream (a redelivery made due on
    #: another node). New result events wake it at once (the node's delivery loop watches
    #: the namespace's stream row), and so do its own lease ends and its next PENDING
    #: delivery's due time.
    poll_s: float = 2.0
    #: The safety re-check of a stream whose last hand-out found its subscription quiet —
    #: nothing leased by any consumer, nothing given back waiting — so that only new result
    #: events (which wake it) or a hand-out by a consumer elsewhere can change that. None:
    #: five times ``poll_s`` (10 s).
    quiet_poll_s: float | None = None


@dataclass(slots=True)
class StreamRegistry:
    """The node's subscription WebSockets: the connections open now, and the options each
    new one takes (tests shorten the timings)."""

    live: set[StreamConnection] = field(default_factory=set)
    options: StreamOptions = field(default_factory=lambda: StreamOptions())


@dataclass
class _Held:
    proof: str = field(repr=False)
    deadline: float  # monotonic time the lease ends (approximately)


def recheck_period(options: StreamOptions, quiet: bool) -> float:
    """The safety re-check period of an idle stream: ``quiet_poll_s`` (default five times
    ``poll_s``) when its last hand-out found nothing in flight, nothing waiting and it holds
    nothing itself; else ``poll_s``."""
    if not quiet:
        return options.poll_s
    return options.quiet_poll_s or 5 * options.poll_s


def _until_tick(period_s: float) -> float:
    """Seconds until the next multiple of ``period_s`` on the monotonic clock (at least a
    tenth of a period: a stream that just polled does not poll again at once)."""
    left = period_s - time.monotonic() % period_s
    return left if left >= period_s / 10 else left + period_s


#: A client frame is an ack, a nack or a ping: a few hundred bytes. Anything far larger is
#: refused before it is parsed.
MAX_CLIENT_FRAME_BYTES = 64 * 1024


def _decode_client_frame(raw: str | bytes) -> ClientFrame:
    """Decode one client frame; size and nesting are checked first, in linear time."""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_CLIENT_FRAME_BYTES:
        raise InvalidRequest(f"frame larger than {MAX_CLIENT_FRAME_BYTES} bytes")
    check_depth(data)
    try:
        return _DECODE_CLIENT.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidRequest(f"bad frame: {exc}") from None


class StreamConnection:
    """One accepted subscription WebSocket; :meth:`run` returns when it ends."""

    def __init__(
        self,
        ws: WebSocket,
        db: Database,
        hub: DeliveryHub,
        sub: SubscriptionRow,
        options: StreamOptions | None = None,
        *,
        max_bytes: int = MAX_PAGE_BYTES,
        rate: tuple[ListBytes, bytes] | None = None,
    ) -> None:
        self.ws = ws
        self.db = db
        self.hub = hub
        self.sub = sub
        self.namespace_id = sub.namespace_id
        self.options = options or StreamOptions()
        self.max_in_flight = sub.max_in_flight
        self.capacity = sub.max_in_flight + CONTROL_SLOTS
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=self.capacity)
        #: The byte budget of one hand-out, and of the frames queued and not yet sent.
        self.max_bytes = max_bytes
        self._queued_bytes = 0  # bytes of the frames queued, not yet sent
        self._drained = asyncio.Event()
        #: The node's list-bytes budget and the application that pays for hand-outs.
        self.rate = rate
        self.unacked: dict[bytes, _Held] = {}
        #: Acks received, not yet settled: group-committed by :meth:`_ack_loop`.
        self._acks: asyncio.Queue[AckFrame] = asyncio.Queue(maxsize=self.capacity)
        self.stats = StreamStats()
        self._wake = hub.watch(sub.namespace_id, sub.id)
        self._probes = hub.lease_probes(db)
        self._acks_round = hub.ack_round(db)
        self._handouts = hub.hand_out_round(db)
        self._last_received = time.monotonic()
        self._last_sent = time.monotonic()

    # -- queue helpers

    async def _put(self, text: str) -> None:
        """Queue a frame for the sender (waits while the queue is full)."""
        await self.queue.put(text)
        self._queued_bytes += len(text)

    def _note_queue(self) -> None:
        self.stats.max_queue = max(self.stats.max_queue, self.queue.qsize())

    async def _send_error(self, code: str, message: str, ref: str | None) -> None:
        self.stats.errors += 1
        await self._put(error_frame(code, message, ref))  # waits: backpressure
        self._note_queue()

    # -- tasks

    async def _feed(self) -> None:
        """Lease into free slots; when idle, wait for a wake-up (new result events, a nack or
        release on this node), the next due time the hand-out reported, this connection's
        earliest lease end, or the safety re-check — no statement per tick."""
        retry_in: float | None = None
        quiet = False  # the last hand-out found nothing in flight and nothing waiting
        while True:
            while self._queued_bytes >= self.max_bytes:  # a slow reader: send what is queued
                self._drained.clear()
                self.stats.drain_waits += 1
                await self._drained.wait()
            if self.rate is not None:  # the application's byte budget is in debt: wait
                wait = self.rate[0].wait_s(self.rate[1])
                if wait > 0:
                    self.stats.throttled += 1
                    await asyncio.sleep(wait)
            self._wake.clear()
            self._expire_local()
            room = min(
                self.max_in_flight - len(self.unacked),
                self.capacity - CONTROL_SLOTS - self.queue.qsize(),
            )
            if room > 0:
                batch = await delivery_pump.lease(
                    self.db, self.namespace_id, self.sub.id, room, max_bytes=self.max_bytes,
                    probes=self._probes, rounds=self._handouts,
                )  # fmt: skip
                self.max_in_flight = min(
                    batch.subscription.max_in_flight, self.capacity - CONTROL_SLOTS
                )
                ttl = batch.subscription.ack_timeout_ms / 1000.0
                for d in batch.deliveries:
                    self.unacked[d.delivery_id] = _Held(d.proof, time.monotonic() + ttl)
                    # A slot is free unless control frames took it meanwhile: then wait.
                    await self._put(delivery_frame(d))
                self.stats.leased += len(batch.deliveries)
                if self.rate is not None:
                    self.rate[0].spend(self.rate[1], handed_out_bytes(batch.deliveries))
                self.stats.max_unacked = max(self.stats.max_unacked, len(self.unacked))
                self._note_queue()
                retry_in = batch.retry_in_s
                if batch.deliveries or batch.behind:
                    continue
                quiet = batch.in_flight == 0 and retry_in is None
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as the event is set, and this task would never end.
            # The safety re-check runs on a tick shared by the process (the next multiple of
            # poll_s on the monotonic clock), so the probes of idle streams go out together
            # as one statement (delivery_pump.LeaseProbes) instead of one each.
            wait = _until_tick(recheck_period(self.options, quiet and not self.unacked))
            if retry_in is not None:
                wait = min(wait, retry_in + 0.005)
            if self.unacked:  # one of ours expires: the hand-out reclaims and redelivers it
                ends = min(h.deadline for h in self.unacked.values()) - time.monotonic()
                wait = min(wait, max(0.0, ends) + 0.005)
            retry_in = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def _expire_local(self) -> None:
        """Forget hand-outs whose lease has ended: the database will redeliver them."""
        now = time.monotonic()
        for key in [k for k, h in self.unacked.items() if h.deadline <= now]:
            del self.unacked[key]

    async def _send(self) -> None:
        while True:
            text = await self.queue.get()
            await self.ws.send_text(text)
            self._queued_bytes -= len(text)
            if self._queued_bytes < self.max_bytes:
                self._drained.set()
            self.stats.sent += 1
            self._last_sent = time.monotonic()

    async def _keepalive(self) -> None:
        opts = self.options
        step = min(opts.ping_interval_s, opts.idle_timeout_s) / 2
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            if now - self._last_received > opts.idle_timeout_s:
                log.info("closing an idle subscription stream")
                return
            if now - self._last_sent >= opts.ping_interval_s:
                try:
                    self.queue.put_nowait(_PING)
                    self._queued_bytes += len(_PING)
                    self._last_sent = now
                except asyncio.QueueFull:
                    self.stats.pings_dropped += 1

    async def _receive(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            self._last_received = time.monotonic()
            raw: Any = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            try:
                frame = _decode_client_frame(raw)
            except InvalidRequest as exc:
                await self._send_error("invalid_request", exc.message, None)
                continue
            if isinstance(frame, AckFrame):
                await self._acks.put(frame)  # settled by _ack_loop; waits when it is full
                await asyncio.sleep(0)  # the ack loop takes it now: a lone ack goes alone
            elif isinstance(frame, NackFrame):
                await self._acks.join()  # the acks received before this nack settle first
                await self._settle(frame)
            elif isinstance(frame, PingFrame):
                await self._put(_PONG)
                self._note_queue()

    async def _settle(self, frame: AckFrame | NackFrame) -> None:
        delivery_id = parse_id(frame.delivery_id)
        try:
            if delivery_id is None:
                raise NotFound("delivery")
            if isinstance(frame, AckFrame):
                await deliveries.ack(self.db, self.namespace_id, delivery_id, frame.proof)
                self.stats.acked += 1
            else:
                await deliveries.nack(
                    self.db, self.namespace_id, delivery_id, frame.proof, frame.retry_after_ms
                )
                self.stats.nacked += 1
                self.hub.notify(self.namespace_id, self.sub.id)
            self._forget(delivery_id, frame.proof)
        except OrbitError as exc:
            if isinstance(exc, StaleProof | NotFound) and delivery_id is not None:
                self._forget(delivery_id, frame.proof)
            nack = isinstance(frame, NackFrame)
            await settle_failure(self.ws, exc, nack, frame.delivery_id, self.namespace_id)
            await self._send_error(exc.code, exc.message, frame.delivery_id)
        except StorageError as exc:
            await self._send_error(*_storage_reply(exc), frame.delivery_id)

    async def _ack_loop(self) -> None:
        """Group commit of acks: the acks that arrive while one batch's transaction is in
        flight are applied together in the next one (:func:`orbit.deliveries.ack_many`,
        each judged alone), so a consumer's ack rate is not bounded by one commit per ack.
        The first ack after a quiet spell goes alone: no batching delay."""
        while True:
            batch = [await self._acks.get()]
            while len(batch) < deliveries.ACK_BATCH and not self._acks.empty():
                batch.append(self._acks.get_nowait())
            try:
                await self._settle_acks(batch)
            finally:
                for _ in batch:
                    self._acks.task_done()

    async def _settle_acks(self, frames: list[AckFrame]) -> None:
        ids = [parse_id(f.delivery_id) for f in frames]
        items = [
            AckItem(self.namespace_id, d, f.proof)
            for d, f in zip(ids, frames, strict=True)
            if d is not None
        ]
        # Into this node's round of acks (every connection's, every namespace's).
        outcomes = iter(await self._acks_round.submit_many(items))
        for delivery_id, f in zip(ids, frames, strict=True):
            outcome = NotFound("delivery") if delivery_id is None else next(outcomes)
            if isinstance(outcome, StorageError):
                await self._send_error(*_storage_reply(outcome), f.delivery_id)
            elif isinstance(outcome, BaseException) and not isinstance(outcome, OrbitError):
                log.error("ack round failed: %r", outcome)
                await self._send_error("internal", "ack failed, retry", f.delivery_id)
            elif isinstance(outcome, OrbitError):
                if isinstance(outcome, StaleProof | NotFound) and delivery_id is not None:
                    self._forget(delivery_id, f.proof)
                await settle_failure(self.ws, outcome, False, f.delivery_id, self.namespace_id)
                await self._send_error(outcome.code, outcome.message, f.delivery_id)
            else:
                assert delivery_id is not None
                self.stats.acked += 1
                self._forget(delivery_id, f.proof)

    def _forget(self, delivery_id: bytes, proof: str) -> None:
        held = self.unacked.get(delivery_id)
        if held is not None and held.proof == proof:
            del self.unacked[delivery_id]
            self._wake.set()

    # -- lifecycle

    async def run(self) -> None:
        """Serve until the client leaves, goes idle, or a task fails; then release."""
        tasks = [
            asyncio.create_task(self._receive(), name="subscription-receive"),
            asyncio.create_task(self._ack_loop(), name="subscription-acks"),
            asyncio.create_task(self._send(), name="subscription-send"),
            asyncio.create_task(self._feed(), name="subscription-feed"),
            asyncio.create_task(self._keepalive(), name="subscription-keepalive"),
        ]
        idle = False
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.get_name() == "subscription-keepalive":
                    idle = True
                elif not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    log.info("subscription stream ended: %s", type(exc).__name__)
        finally:
            if not tasks[1].done():  # acks already received are applied before the release
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        await self._acks.join()
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=5.0)  # bounded, whatever a task does
            await asyncio.shield(self._release())
            self.hub.unwatch(self.namespace_id, self.sub.id, self._wake)
        if self.ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):  # a client that does not read may never drain
                    await self.ws.close(
                        code=IDLE_CLOSE_CODE if idle else 1000,
                        reason="idle timeout" if idle else "",
                    )

    async def _release(self) -> None:
        held = [(k, h.proof) for k, h in self.unacked.items()]
        self.unacked.clear()
        if not held:
            return
        try:
            self.stats.released = await deliveries.release_many(self.db, self.namespace_id, held)
        except Exception:
            # Not fatal: the leases expire and the deliveries come back then.
            log.exception("could not release %d deliveries of a closed stream", len(held))
            return
        self.hub.notify(self.namespace_id, self.sub.id)
