"""The uvicorn HTTP protocol classes ``orbit-server`` serves with: uvicorn's h11 and httptools
protocols plus a deadline for each request head (the slow-loris bound, ``--header-timeout``).
:func:`http_protocol` picks the class for ``--http``."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C HTTP parser (optional: `--http httptools`); h11 is the default
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - depends on the environment
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


class _HeadDeadline:
    """The request-head deadline shared by both HTTP protocols: a timer armed when a wait
    for a head begins, cancelled when the head is in; on expiry the connection is closed
    if it still waits for its head (``_awaiting_head``)."""

    head_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: Any

    def _awaiting_head(self) -> bool:
        return True

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_expired)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            self.transport.close()


class HeadDeadlineH11(_HeadDeadline, H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request *head* (slow-loris bound).

    uvicorn closes idle keep-alive connections but waits forever for the rest of a request
    head that is trickled a byte at a time. Here a connection waiting for a head (new, or
    keep-alive with a partial next request) is closed ``head_timeout`` seconds after the
    wait began. Bodies and WebSockets are not affected (the deadline stops at the head).
    """

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()
        else:
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE


if HttpToolsProtocol is not None:

    class HeadDeadlineHttpTools(_HeadDeadline, HttpToolsProtocol):
        """uvicorn's httptools (C parser) protocol with the same request-head deadline as
        :class:`HeadDeadlineH11`: armed when a connection opens and when a response completes
        with no pipelined request behind it (the wait for the next head begins), cancelled
        when a head has been parsed. Data arriving in between does not extend it.
        """

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def on_headers_complete(self) -> None:
            self._cancel_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            waiting = not self.pipeline
            super().on_response_complete()
            if waiting and not self.transport.is_closing():
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)


def http_protocol(parser: str, head_timeout: float) -> type[asyncio.Protocol]:
    """The uvicorn HTTP protocol class for ``parser`` (``auto``: httptools when installed,
    else h11), with the request-head deadline ``head_timeout`` seconds."""
    if parser not in ("auto", "h11", "httptools"):
        raise ValueError(f"bad --http: auto, h11 or httptools, not {parser!r}")
    if parser == "httptools" and HttpToolsProtocol is None:
        raise ValueError("bad --http: httptools is not installed (pip install httptools)")
    if parser == "h11" or HttpToolsProtocol is None:
        return type("OrbitH11", (HeadDeadlineH11,), {"head_timeout": head_timeout})
    return type("OrbitHttpTools", (HeadDeadlineHttpTools,), {"head_timeout": head_timeout})
