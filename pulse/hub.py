"""Per-node registry of connected worker sessions: offers pushed, wake-ups, cancel pushes.

Everything here is a *hint* kept in this process's memory: which sessions hold a stream (or
a long-poll) on this node, which attempts were offered through them, and whether new work may
be waiting. The database stays the truth: the dispatcher re-checks each session's row
(ACTIVE, held by this node, not expired) and its capacity under a row lock before offering,
and a lost push is repaired by lease expiry and heartbeats. A restart loses nothing that
matters.

* :meth:`Hub.notify_new_work` — called after a submit/retry/resume commits; wakes this
  node's dispatcher at once (other nodes find the work by polling).
* :meth:`Hub.request_cancel` — pushes ``cancel`` when the attempt's session streams to this
  node; otherwise the worker learns it from ``cancel_requested`` in its next heartbeat.
* :meth:`Hub.push_offers` — after the dispatch transaction committed, never inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from typing import Protocol

from starlette.websockets import WebSocket, WebSocketState

from orbit.ids import id_hex, parse_id
from pulse import wire
from pulse.sessions import QueueRef, SessionInfo, WorkerSettings

log = logging.getLogger("pulse.hub")

Key = tuple[bytes, bytes]  # (namespace_id, session_id)

#: WebSocket close codes (4000 + the HTTP status, as orbit.http.errors does).
CLOSE_SESSION_GONE = 4401
CLOSE_REPLACED = 4409
#: Policy violation: the worker stopped reading its stream (a push did not drain in time).
CLOSE_NOT_READING = 1008

#: Longest one push to a worker's socket may wait for the socket to drain
#: (``ORBIT_PULSE_SEND_TIMEOUT_MS``, default 10 s). A worker that stops reading must not stall
#: this node's dispatcher (which pushes offers session after session) or its cancel pushes:
#: past the deadline the stream is closed and its offers return by offer-lease expiry.
SEND_TIMEOUT_S = int(os.environ.get("ORBIT_PULSE_SEND_TIMEOUT_MS", "10000")) / 1000


class Connection:
    """A session's live transport on this node (WebSocket stream or long-poll mailbox)."""

    kind = "abstract"

    def __init__(self, info: SessionInfo, queues: Sequence[QueueRef]) -> None:
        self.info = info
        self.queues = list(queues)
        self.closed = False
        #: Attempts a ``cancel`` was pushed for (pushed once per connection).
        self.cancels_sent: set[str] = set()
        #: The last dispatch round gave it fewer offers than free slots because of the
        #: offer depth (WorkerSettings.offer_depth_percent): its next start wakes the dispatcher.
        self.depth_capped = False

    @property
    def key(self) -> Key:
        return self.info.key

    def wants_offers(self) -> bool:
        """True when offers pushed now would reach the worker."""
        return not self.closed

    async def send(self, frame: wire.ServerFrame) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    async def send_offers(self, offers: Sequence[wire.Offer]) -> bool:
        ok = True
        for offer in offers:
            ok = await self.send(offer) and ok
        return ok

    async def send_cancel(self, attempt_id: str, reason: str) -> bool:
        """Push ``cancel`` once per attempt; False when it cannot reach the worker."""
        if attempt_id in self.cancels_sent:
            return True
        ok = await self.send(wire.Cancel(attempt_id=attempt_id, reason=reason))
        if ok:
            self.cancels_sent.add(attempt_id)
        return ok

    async def close(self, code: int, reason: str) -> None:
        self.closed = True


class WsConnection(Connection):
    """A WebSocket stream: frames are sent one at a time (a send lock).

    With ``batch`` (the worker offered the ``orbit.batch.v1`` subprotocol), the frames sent
    while the event loop runs other work are gathered and written as ONE ``batch`` frame
    (``{"type": "batch", "frames": [...]}``, each frame encoded once): the offers of a
    dispatch round, the replies of the frames a worker sent together. Nothing waits for a
    batch to fill: the write goes out as soon as the loop comes round to it.
    """

    kind = "ws"

    def __init__(
        self,
        info: SessionInfo,
        queues: Sequence[QueueRef],
        websocket: WebSocket,
        *,
        batch: bool = False,
    ) -> None:
        super().__init__(info, queues)
        self.websocket = websocket
        self.batch = batch
        self._lock = asyncio.Lock()
        self._closer: asyncio.Task[None] | None = None
        self._out: list[bytes] = []
        self._flusher: asyncio.Task[bool] | None = None
        #: Transport writes and frames sent through them (for tests and metrics).
        self.writes = 0
        self.frames_sent = 0

    async def send(self, frame: wire.ServerFrame) -> bool:
        if self.closed:
            return False
        if not self.batch:
            return await self._write(wire.encode(frame), 1)
        self._out.append(wire.encode(frame))
        flusher = self._flusher
        if flusher is None or flusher.done():
            flusher = self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(flusher)

    async def _flush(self) -> bool:
        await asyncio.sleep(0)  # the frames sent meanwhile go with this write
        out, self._out = self._out, []
        self._flusher = None
        if not out:
            return True
        if len(out) == 1:
            return await self._write(out[0], 1)
        return await self._write(wire.BATCH_HEAD + b",".join(out) + b"]}", len(out))

    async def _write(self, data: bytes, frames: int) -> bool:
        if self.closed:
            return False
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                async with self._lock:
                    await self.websocket.send_text(data.decode())
            self.writes += 1
            self.frames_sent += frames
            return True
        except TimeoutError:
            log.warning(
                "session %s stopped reading its stream; closing it",
                id_hex(self.info.session_id),
            )
            self.closed = True
            # Closing sends a close frame, which may block too: never wait for it here.
            self._closer = asyncio.create_task(self._close_stuck())
            return False
        except Exception:  # the peer went away: the receive loop ends the connection
            self.closed = True
            return False

    async def _close_stuck(self) -> None:
        with contextlib.suppress(Exception):
            await self.websocket.close(code=CLOSE_NOT_READING, reason="not_reading")

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                await self.websocket.close(code=code, reason=reason)


class PollConnection(Connection):
    """HTTP long-poll: offers wait in a mailbox until the worker's next poll takes them.

    The dispatcher offers only while a poll is waiting, so the mailbox holds at most what
    the worker's capacity allows and is normally empty between polls.
    """

    kind = "poll"

    def __init__(self, info: SessionInfo, queues: Sequence[QueueRef]) -> None:
        super().__init__(info, queues)
        self.mailbox: list[wire.Offer] = []
        self._waiter: asyncio.Future[None] | None = None
        self.last_poll = time.monotonic()

    def wants_offers(self) -> bool:
        return not self.closed and self._waiter is not None and not self._waiter.done()

    async def send(self, frame: wire.ServerFrame) -> bool:
        if isinstance(frame, wire.Offer) and not self.closed:
            self.mailbox.append(frame)
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
            return True
        return False  # cancel and other frames: the worker learns them from heartbeats

    async def wait(self, timeout_s: float) -> list[wire.Offer]:
        """Wait up to ``timeout_s`` for offers; return (and take) what the mailbox holds."""
        self.last_poll = time.monotonic()
        if not self.mailbox and timeout_s > 0:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._waiter), timeout_s)
            finally:
                self._waiter = None
        self.last_poll = time.monotonic()
        taken, self.mailbox = self.mailbox, []
        return taken

    def idle_for(self) -> float:
        return 0.0 if self._waiter is not None else time.monotonic() - self.last_poll

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Notifier(Protocol):
    """What services tell this node's workers after COMMIT: new work to offer, a running
    attempt to stop. The :class:`Hub` is the one the server runs; tests pass a recorder.
    Services tell it through :func:`wake_queue` and :func:`push_cancel`, which never raise (a
    lost push is repaired by polling and lease expiry)."""

    def notify_new_work(
        self, namespace_id: bytes | None = None, queue_id: bytes | None = None
    ) -> Awaitable[None] | None: ...

    def request_cancel(
        self, namespace_id: bytes, task_id: bytes, attempt_id: bytes
    ) -> Awaitable[bool | None]: ...


async def wake_queue(hub: Notifier | None, namespace_id: bytes, queue_id: bytes) -> None:
    """After COMMIT: new work in ``queue_id`` (offer it to sessions waiting here). Never
    raises: the change is committed, a lost push is repaired by polling."""
    if hub is None:
        return
    try:
        res = hub.notify_new_work(namespace_id, queue_id)
        if res is not None:
            await res
    except Exception:
        log.exception("pulse hub notify_new_work failed")


async def push_cancel(
    hub: Notifier | None, namespace_id: bytes, task_id: bytes, attempt_id: bytes
) -> None:
    """After COMMIT: tell the worker running ``attempt_id`` to stop. Never raises: a lost
    push is repaired by the worker's next heartbeat (``cancel_requested``)."""
    if hub is None:
        return
    try:
        await hub.request_cancel(namespace_id, task_id, attempt_id)
    except Exception:
        log.exception("pulse hub request_cancel failed")


class Hub:
    """This node's connected sessions and the dispatcher's wake-up signal."""

    def __init__(self, node_id: str, settings: WorkerSettings | None = None) -> None:
        self.node_id = node_id
        self.settings = settings or WorkerSettings()
        self._conns: dict[Key, Connection] = {}
        self._attempts: dict[bytes, Key] = {}
        self._work = asyncio.Event()

    # -- connections -----------------------------------------------------------------------

    def register(self, conn: Connection) -> Connection | None:
        """Make ``conn`` the session's transport on this node; return the one it replaces
        (the caller closes it)."""
        previous = self._conns.get(conn.key)
        self._conns[conn.key] = conn
        self._work.set()
        return previous if previous is not conn else None

    def unregister(self, conn: Connection) -> bool:
        """Forget ``conn`` if it is still the session's transport; True when it was."""
        if self._conns.get(conn.key) is not conn:
            return False
        del self._conns[conn.key]
        for aid in [a for a, k in self._attempts.items() if k == conn.key]:
            del self._attempts[aid]
        return True

    def get(self, namespace_id: bytes, session_id: bytes) -> Connection | None:
        return self._conns.get((namespace_id, session_id))

    def connections(self) -> list[Connection]:
        """The live connections (long-poll ones idle past the longest wait are dropped)."""
        limit = 2 * self.settings.poll_max_wait_ms / 1000 + 5
        for conn in list(self._conns.values()):
            if isinstance(conn, PollConnection) and conn.idle_for() > limit:
                self.unregister(conn)
                conn.closed = True
        return [c for c in self._conns.values() if not c.closed]

    def counts(self) -> dict[str, int]:
        """Connections by kind (for /metrics)."""
        out: dict[str, int] = {"ws": 0, "poll": 0}
        for c in self._conns.values():
            out[c.kind] = out.get(c.kind, 0) + 1
        return out

    async def close_session(
        self,
        namespace_id: bytes,
        session_id: bytes,
        code: int = CLOSE_SESSION_GONE,
        reason: str = "session_expired",
    ) -> None:
        """End the session's transport on this node (expired, or taken over elsewhere)."""
        conn = self._conns.get((namespace_id, session_id))
        if conn is not None:
            self.unregister(conn)
            await conn.close(code, reason)

    # -- attempts --------------------------------------------------------------------------

    def track(self, attempt_id: bytes, key: Key) -> None:
        """Remember which session (on this node) holds ``attempt_id``."""
        self._attempts[attempt_id] = key

    def forget(self, attempt_id: bytes) -> None:
        self._attempts.pop(attempt_id, None)

    def holder(self, attempt_id: bytes) -> Connection | None:
        key = self._attempts.get(attempt_id)
        return None if key is None else self._conns.get(key)

    # -- work ------------------------------------------------------------------------------

    def notify_new_work(
        self, namespace_id: bytes | None = None, queue_id: bytes | None = None
    ) -> None:
        """New or returned work (after its transaction committed): wake the dispatcher."""
        self._work.set()

    async def wait_for_work(self, timeout_s: float, stop: asyncio.Event | None = None) -> bool:
        """Sleep until woken (or ``stop`` is set) or ``timeout_s`` passes; True when woken."""
        waits = [asyncio.ensure_future(self._work.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
        self._work.clear()
        return bool(done)

    async def push_offers(self, conn: Connection, offers: Sequence[wire.Offer]) -> bool:
        """Send committed offers to the session's transport. False: it could not take them
        (they expire and return to the queue by themselves)."""
        for offer in offers:
            aid = parse_id(offer.attempt_id)
            if aid is not None:
                self.track(aid, conn.key)
        ok = await conn.send_offers(offers)
        if not ok:
            log.info("offers to session %s not delivered", id_hex(conn.info.session_id))
        return ok

    async def request_cancel(
        self,
        namespace_id: bytes,
        task_id: bytes,
        attempt_id: bytes,
        reason: str = "cancel_requested",
    ) -> bool:
        """Push ``cancel`` for a running attempt when its session streams to this node.

        False when it is not here (or not a stream): the worker then sees
        ``cancel_requested`` in its next ``heartbeat_ok`` (the flag is in the database).
        """
        conn = self.holder(attempt_id)
        if conn is None or conn.info.namespace_id != namespace_id:
            return False
        return await conn.send_cancel(id_hex(attempt_id), reason)
