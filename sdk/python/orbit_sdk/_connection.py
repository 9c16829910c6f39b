"""The worker's link to the server: session, WebSocket stream, replies, reconnects.

:class:`StreamConnection` creates a worker session over HTTP (API key), opens the stream
(session token), matches replies to requests by ``msg_id`` and hands server-initiated
frames (``offer``, ``cancel``) to callbacks. When the stream drops it reconnects with
backoff to the same session (never waiting longer than a heartbeat interval while that
session may still be alive); when the server refuses the stream with 401/403/404 the
session is gone, so it creates a new one at once. Any answer from the server resets the
backoff. Given several base URLs, a node that cannot be reached or that drops the stream
makes it try the next node at once, with the same session (any node serves it); the
backoff applies only once every node of the round failed.

Requests declare what happens to them if the connection drops before their reply
(:class:`Resend`): reports and effects are re-sent byte-identical after the reconnect
(the server answers a duplicate report with the original receipt), a ``start`` is re-sent
only on the same session (the offer belongs to it), a heartbeat is never re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import math
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI, WebSocketException
from websockets.typing import Subprotocol

from ._backoff import Backoff
from ._endpoints import ws_url
from ._http import HttpTransport, seg
from ._keyed import KeyedWaitingLog
from .errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    OrbitConnectionError,
    OrbitError,
    Unauthenticated,
    error_from_code,
)
from .wire import (
    BATCH_DECODER,
    BATCH_HEAD,
    BATCH_SUBPROTOCOL,
    SERVER_DECODER,
    Cancel,
    Offer,
    ServerError,
    ServerFrame,
    SessionClosed,
    SessionCreate,
    SessionCreated,
    WorkerFrame,
    encode,
)

__all__ = ["Resend", "StreamConnection"]

logger = logging.getLogger("orbit_sdk.connection")

_FATAL_SESSION_ERRORS = (Unauthenticated, Forbidden, InvalidRequest, NotFound)
# The stream's handshake is refused with 401/404 for an unknown or expired session; a server
# that closes the socket before accepting it yields 403 (ASGI servers' default).
_SESSION_GONE_STATUS = frozenset({401, 403, 404})
# Close code of an accepted stream whose session expired (server-side ``CLOSE_SESSION_GONE``).
_CLOSE_SESSION_GONE = 4401
_MAX_FRAME = 32 * 1024 * 1024
# Answers that mean "busy, try later": 429 (rate limited, cooling down) and 503 (not ready:
# the node's database pool or connection limit is exhausted, the database is restarting).
_BUSY_STATUS = frozenset({429, 503})
#: Longest wait after a busy answer without Retry-After (seconds): the delay grows from the
#: backoff's initial one while the server keeps saying busy, up to this.
BUSY_MAX_S = 2.0
#: A Retry-After is waited out stretched by a random share of up to this fraction of it, so
#: the workers a node turned away at one moment do not all come back at the same instant.
RETRY_AFTER_SPREAD = 0.5


def _retry_after_header(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header in its delta-seconds form (None otherwise)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def busy_wait(backoff_delay: float, retry_after: float | None, spread: float) -> float:
    """The wait after a busy answer (429/503): the growing backoff delay cut to
    :data:`BUSY_MAX_S`, or the server's ``Retry-After`` stretched by ``spread`` (a random
    fraction in [0, 1) of :data:`RETRY_AFTER_SPREAD`), whichever is longer."""
    wait = min(backoff_delay, BUSY_MAX_S)
    if retry_after is not None:
        wait = max(wait, retry_after * (1.0 + RETRY_AFTER_SPREAD * spread))
    return wait


class _Redact(logging.Filter):
    """Scrubs secrets from websockets' debug logs, which print the handshake headers
    (``Authorization: Bearer <session token>``) and a preview of every frame (reports carry
    the execution token; an elided preview can still show part of it, so frame data is
    dropped altogether and only its opcode and size are kept)."""

    _PATTERNS = (
        (
            re.compile(r"^([<>] (?:TEXT|BINARY|CONT)) .*(\[[^\]]*\])$", re.DOTALL),
            r"\1 [data hidden] \2",
        ),
        (re.compile(r"Bearer\s+\S+"), "Bearer [redacted]"),
        (re.compile(r'("(?:execution_token|session_token)"\s*:\s*")[^"]*"?'), r'\1[redacted]"'),
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = message
        for pattern, replacement in self._PATTERNS:
            redacted = pattern.sub(replacement, redacted)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_ws_logger = logging.getLogger("orbit_sdk.websockets")
_ws_logger.addFilter(_Redact())


class Resend(enum.Enum):
    """What a request does when the connection drops before its reply."""

    NEVER = "never"  # fail at once (heartbeats: the next one follows anyway)
    SAME_SESSION = "same_session"  # re-send if the stream comes back on the same session
    ALWAYS = "always"  # re-send the identical bytes after any reconnect (reports, effects)


def _now() -> float:
    return asyncio.get_running_loop().time()


class _SessionGone(Exception):
    """The server refused the stream: the session expired or was never known."""


class _FrameType(msgspec.Struct):
    type: str = "?"


@dataclass(eq=False)
class _Pending:
    msg_id: str
    data: bytes
    resend: Resend
    future: asyncio.Future[ServerFrame]
    session_id: str | None
    sent_epoch: int = -1


@dataclass
class ConnectionStats:
    """Counters of the connection's life."""

    sessions: int = 0
    connects: int = 0
    resent: int = 0


class StreamConnection:
    """One worker's session and stream, kept alive until :meth:`close`."""

    def __init__(
        self,
        http: HttpTransport,
        namespace: str,
        session_request: Callable[[str | None], SessionCreate],
        *,
        on_offer: Callable[[Offer], None],
        on_cancel: Callable[[Cancel], None],
        on_connected: Callable[[], None],
        on_session_lost: Callable[[str], None],
        backoff: Backoff,
        open_timeout: float = 10.0,
    ) -> None:
        self._http = http
        self._ns = namespace
        self._session_request = session_request
        self._on_offer = on_offer
        self._on_cancel = on_cancel
        self._on_connected = on_connected
        self._on_session_lost = on_session_lost
        self._backoff = backoff
        self._open_timeout = open_timeout
        self._session: SessionCreated | None = None
        #: Loop time of the server's last answer (session created, stream open, a frame).
        self._last_contact = 0.0
        self._instance_id: str | None = None
        self._ws: ClientConnection | None = None
        self._epoch = 0
        self._pending: dict[str, _Pending] = {}
        #: The stream negotiated batch frames (the server speaks ``orbit.batch.v1``).
        self._batch = False
        #: Frames to write with the next transport write, each with its stream's epoch.
        self._outbox: list[tuple[int, bytes]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._stop = asyncio.Event()
        self._msg_ids = (f"{secrets.token_hex(4)}-{n}" for n in itertools.count(1))
        #: Nodes (base URLs) not tried yet in the current round of failures.
        self._untried = len(http.endpoints)
        #: The last stream ended without a close frame (its node went away).
        self._lost_abruptly = False
        self.stats = ConnectionStats()
        #: What the server says about keyed tasks waiting on a worker that does not take them.
        self.keyed_waiting = KeyedWaitingLog()

    # ------------------------------------------------------------------ state

    @property
    def session(self) -> SessionCreated | None:
        """The current session (None before the first one, or after it was lost)."""
        return self._session

    @property
    def connected(self) -> bool:
        """True while the stream is open."""
        return self._ws is not None

    def next_msg_id(self) -> str:
        """A fresh ``msg_id`` (unique for this connection object)."""
        return next(self._msg_ids)

    async def wait_connected(self) -> None:
        """Wait until the stream is open."""
        await self._connected.wait()

    # ------------------------------------------------------------------ requests

    async def request(self, frame: WorkerFrame, *, resend: Resend) -> ServerFrame:
        """Send ``frame`` and return the server's reply to its ``msg_id``.

        An ``error`` reply is raised as its OrbitError class (``StaleToken`` ...). A lost
        connection raises :class:`OrbitConnectionError` unless ``resend`` keeps the request
        alive across the reconnect. Bound the wait with ``asyncio.timeout`` if needed.
        """
        if self._closing:
            raise OrbitConnectionError("worker connection is closed")
        if resend is Resend.NEVER and self._ws is None:
            raise OrbitConnectionError("not connected")
        future: asyncio.Future[ServerFrame] = asyncio.get_running_loop().create_future()
        pending = _Pending(
            msg_id=frame.msg_id,
            data=encode(frame),
            resend=resend,
            future=future,
            session_id=self._session.session_id if self._session else None,
        )
        self._pending[pending.msg_id] = pending
        try:
            await self._send(pending)
            return await future
        finally:
            self._pending.pop(pending.msg_id, None)

    async def _send(self, pending: _Pending) -> None:
        ws, epoch = self._ws, self._epoch
        if ws is None or pending.sent_epoch == epoch or pending.future.done():
            return
        if pending.sent_epoch != -1:
            self.stats.resent += 1
        pending.sent_epoch = epoch
        if self._batch:
            # Gathered with the frames sent while the loop runs other work, and written
            # together as soon as it comes round (nothing waits for a batch to fill).
            self._outbox.append((epoch, pending.data))
            if self._flusher is None:
                self._flusher = asyncio.create_task(self._flush())
            return
        # On a closed connection the reader notices; the request is re-sent or failed then.
        with contextlib.suppress(ConnectionClosed):
            await ws.send(pending.data, text=True)

    async def _flush(self) -> None:
        await asyncio.sleep(0)
        self._flusher = None
        ws, epoch = self._ws, self._epoch
        # Frames of a stream that ended stay pending: they are re-sent after the reconnect.
        out = [data for e, data in self._outbox if e == epoch]
        self._outbox = []
        if ws is None or not out:
            return
        data = out[0] if len(out) == 1 else BATCH_HEAD + b",".join(out) + b"]}"
        with contextlib.suppress(ConnectionClosed):
            await ws.send(data, text=True)

    def _fail_pending(self, exc_for: Callable[[_Pending], Exception | None]) -> None:
        for pending in list(self._pending.values()):
            exc = exc_for(pending)
            if exc is not None and not pending.future.done():
                pending.future.set_exception(exc)

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        """Keep a session and stream open until :meth:`close`.

        Reconnect delays (docs/sdk.md "Reconnects"): the backoff grows while the server
        cannot be reached and starts again from its initial delay as soon as the server
        answers anything (an error status, a refused handshake); when the server says the
        session is gone, a new session is opened at once. While the session may still be
        alive on the server (less than its ``lease_ms`` since the server last answered), a
        delay is never longer than the session's heartbeat interval, so a server node that
        comes back (or a load balancer that finds another node) gets the worker back
        before its session expires: its running attempts and undelivered reports survive.

        Raises the OrbitError when the server refuses to create a session for a reason
        that waiting will not fix (401, 403, 400, 404): the worker is misconfigured.
        """
        try:
            while not self._closing:
                delay: float | None = None
                answered = False
                busy = False
                fresh = self._session is None
                node = self._http.base_url
                node_failed = False
                try:
                    if self._session is None:
                        await self._create_session()
                    if not self._closing:
                        await self._serve_stream()
                except _SessionGone:
                    self._drop_session("the server refused the stream (session gone)")
                    if not fresh:
                        # The server has just answered: open the new session now.
                        self._backoff.reset()
                        continue
                    # A session refused right after it was created: wait as for a failure.
                except _FATAL_SESSION_ERRORS:
                    raise
                except OrbitError as exc:
                    answered = not isinstance(exc, OrbitConnectionError)
                    busy = getattr(exc, "status", None) in _BUSY_STATUS
                    retry_after = getattr(exc, "retry_after", None)
                    delay = retry_after if isinstance(retry_after, (int, float)) else None
                    logger.warning("worker session: %s (%s)", exc.code, exc.message)
                except (OSError, TimeoutError, WebSocketException) as exc:
                    answered = isinstance(exc, InvalidStatus)  # e.g. a 503 to the handshake
                    if isinstance(exc, InvalidStatus) and (
                        exc.response.status_code in _BUSY_STATUS
                    ):
                        busy = True
                        delay = _retry_after_header(exc.response.headers.get("Retry-After"))
                    node_failed = True
                    logger.warning("worker stream: %s: %s", type(exc).__name__, exc)
                except Exception:
                    # A bug or an unexpected answer must not kill a long-running worker:
                    # log it loudly and reconnect with backoff.
                    logger.exception("worker connection failed unexpectedly")
                if self._closing:
                    break
                if (node_failed or self._lost_abruptly) and self._next_node(node):
                    continue  # another node at once: the backoff waits for a whole round
                if busy:
                    # The server is there but turned us away: wait as it says, and longer
                    # while it keeps saying so (bounded), never as for an unreachable server.
                    wait = busy_wait(self._backoff.next_delay(), delay, random.random())
                    wait = min(wait, max(self._session_bound(), delay or 0.0))
                else:
                    if answered:
                        self._backoff.reset()
                    wait = min(self._backoff.next_delay(), self._session_bound())
                    if delay is not None:
                        wait = max(wait, delay)
                logger.info("reconnecting in %.2fs", wait)
                try:
                    async with asyncio.timeout(wait):
                        await self._stop.wait()
                except TimeoutError:
                    pass
        finally:
            self._ws = None
            self._connected.clear()
            self._fail_pending(lambda p: OrbitConnectionError("worker connection closed"))

    def _next_node(self, failed: str) -> bool:
        """The node ``failed`` could not be reached (or dropped the stream): move to the next
        of several base URLs. True when that one has not been tried in this round yet (so
        it is tried at once); False after a whole round (then the backoff applies)."""
        self._lost_abruptly = False
        endpoints = self._http.endpoints
        if not endpoints.failed(failed):
            return False
        if self._untried > 1:
            self._untried -= 1
            return True
        self._untried = len(endpoints)
        return False

    def _session_bound(self) -> float:
        """The longest reconnect delay while the session may still be alive on the server:
        its heartbeat interval (infinite without a session, or once ``lease_ms`` passed
        since the server last answered — the session has expired by then)."""
        session = self._session
        if session is None:
            return math.inf
        if _now() - self._last_contact >= session.lease_ms / 1000:
            return math.inf
        return max(session.heartbeat_ms, 1) / 1000

    async def end_session(self, wait: float = 5.0) -> SessionClosed | None:
        """Graceful end: stop reconnecting, then close the current session on the server
        (``DELETE …/workers/sessions/{sid}``: its unstarted offers go back to the queue at
        once, anything still running is recovered like an expired session's attempts) —
        instead of letting it expire ``lease_ms`` later. Best effort: a failure is logged,
        the session then simply expires. ``wait`` bounds the call (seconds). Call
        :meth:`close` afterwards."""
        self._closing = True
        self._stop.set()
        session = self._session
        if session is None:
            return None
        path = f"/v1/namespaces/{seg(self._ns)}/workers/sessions/{seg(session.session_id)}"
        try:
            async with asyncio.timeout(wait):
                closed = await self._http.call(
                    "DELETE", path, SessionClosed, token=session.session_token
                )
        except (OrbitError, TimeoutError) as exc:
            logger.warning("worker session %s not closed: %s", session.session_id, exc)
            return None
        self._session = None
        logger.info(
            "worker session %s closed (%d offers released, %d running attempts recovered)",
            session.session_id,
            closed.released_offers,
            closed.lost_attempts,
        )
        return closed

    async def close(self) -> None:
        """Stop reconnecting and close the stream; pending requests fail."""
        self._closing = True
        self._stop.set()
        ws = self._ws
        if ws is not None:
            await ws.close()

    async def _create_session(self) -> None:
        body = self._session_request(self._instance_id)
        path = f"/v1/namespaces/{seg(self._ns)}/workers/sessions"
        session = await self._http.call("POST", path, SessionCreated, body=body)
        self._session = session
        self._last_contact = _now()
        self._instance_id = session.instance_id or self._instance_id
        self.stats.sessions += 1
        logger.info(
            "worker session %s created (instance %s, heartbeat %d ms, lease %d ms)",
            session.session_id,
            session.instance_id,
            session.heartbeat_ms,
            session.lease_ms,
        )
        self.keyed_waiting.note(session.keyed_waiting)

    def _drop_session(self, why: str) -> None:
        session = self._session
        self._session = None
        if session is None:
            return
        logger.warning("worker session %s lost: %s", session.session_id, why)
        lost = session.session_id
        self._fail_pending(
            lambda p: (
                OrbitConnectionError("session lost")
                if p.resend is Resend.SAME_SESSION and p.session_id == lost
                else None
            )
        )
        self._on_session_lost(lost)

    def _stream_url(self, session: SessionCreated) -> str:
        base = ws_url(self._http.base_url)
        return f"{base}/v1/namespaces/{seg(self._ns)}/workers/sessions/{seg(session.session_id)}/stream"

    async def _serve_stream(self) -> None:
        session = self._session
        assert session is not None
        try:
            ws = await connect(
                self._stream_url(session),
                additional_headers={"Authorization": f"Bearer {session.session_token}"},
                open_timeout=self._open_timeout,
                max_size=_MAX_FRAME,
                compression=None,
                subprotocols=[Subprotocol(BATCH_SUBPROTOCOL)],
                logger=_ws_logger,
            )
        except InvalidStatus as exc:
            if exc.response.status_code in _SESSION_GONE_STATUS:
                raise _SessionGone from exc
            raise
        except InvalidURI as exc:
            raise OrbitConnectionError(f"bad stream URL: {exc}") from exc
        if self._closing:  # close() ran during the handshake
            await ws.close()
            return
        self._ws = ws
        self._epoch += 1
        self._batch = ws.subprotocol == BATCH_SUBPROTOCOL
        self._last_contact = _now()
        self.stats.connects += 1
        self._untried = len(self._http.endpoints)
        self._connected.set()
        logger.info("worker stream open (session %s)", session.session_id)
        try:
            self._on_connected()
            await self._flush_pending(session.session_id)
            first = True
            while True:
                raw = await ws.recv(decode=False)
                self._last_contact = _now()
                if first:
                    self._backoff.reset()
                    first = False
                self._dispatch(raw if isinstance(raw, bytes) else raw.encode())
        except ConnectionClosed as exc:
            if self._closing:
                logger.debug("worker stream closed: %s", exc)
            elif exc.rcvd is not None and exc.rcvd.code == _CLOSE_SESSION_GONE:
                raise _SessionGone from exc
            else:
                # No close frame, or "going away" / "service restart": the node left.
                self._lost_abruptly = exc.rcvd is None or exc.rcvd.code in (1001, 1012)
                logger.warning("worker stream lost: %s", exc)
        finally:
            self._ws = None
            self._connected.clear()
            self._fail_pending(
                lambda p: (
                    OrbitConnectionError("connection lost") if p.resend is Resend.NEVER else None
                )
            )
            await ws.close()

    async def _flush_pending(self, session_id: str) -> None:
        for pending in list(self._pending.values()):
            if pending.resend is Resend.SAME_SESSION and pending.session_id != session_id:
                if not pending.future.done():
                    pending.future.set_exception(OrbitConnectionError("session changed"))
                continue
            await self._send(pending)

    # ------------------------------------------------------------------ inbound

    def _dispatch(self, raw: bytes) -> None:
        if self._batch and raw.startswith(b'{"type":"batch"'):
            try:
                frames = BATCH_DECODER.decode(raw).frames
            except msgspec.DecodeError as exc:
                logger.warning("ignoring a malformed batch frame: %s", exc)
                return
            for frame in frames:
                self._dispatch_one(bytes(frame))
            return
        self._dispatch_one(raw)

    def _dispatch_one(self, raw: bytes) -> None:
        try:
            frame = SERVER_DECODER.decode(raw)
        except msgspec.DecodeError as exc:
            try:
                kind = msgspec.json.decode(raw, type=_FrameType).type
            except msgspec.DecodeError:
                kind = "<not JSON>"
            logger.warning("ignoring server frame of type %r: %s", kind, exc)
            return
        try:
            if isinstance(frame, Offer):
                self._on_offer(frame)
            elif isinstance(frame, Cancel):
                self._on_cancel(frame)
            else:
                self._resolve(frame)
        except Exception:
            logger.exception("error while handling a %s frame", type(frame).__name__)

    def _resolve(self, frame: ServerFrame) -> None:
        ref = getattr(frame, "ref_msg_id", None)
        pending = self._pending.get(ref) if ref else None
        if isinstance(frame, ServerError):
            if pending is None:
                logger.warning("server error %s: %s", frame.code, frame.message)
                return
            if frame.code == Unauthenticated.code and pending.resend is not Resend.NEVER:
                # The session expired under this request; the server closes the stream next.
                # Keep the request: it is re-sent (or failed) after the reconnect.
                logger.info("request %s hit an expired session; it will be re-sent", ref)
                return
            if not pending.future.done():
                pending.future.set_exception(
                    error_from_code(frame.code, frame.message, details=frame.details)
                )
            return
        if pending is None:
            logger.debug("reply %s to unknown or expired request %s", type(frame).__name__, ref)
            return
        if not pending.future.done():
            pending.future.set_result(frame)
