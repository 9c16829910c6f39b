"""The uvicorn WebSocket protocol ``orbit-server`` serves with: uvicorn's sans-I/O
``websockets`` protocol that stops reading a peer once the server has closed its stream.

When the application closes a WebSocket (a worker stream over its frame, error or heartbeat
budget gets 1008; a session that ends gets its own code), uvicorn waits up to its close
timeout (10 s) for the peer's close reply, and parses (inflates, checks) every frame the
peer sends meanwhile only to discard it. A peer flooding its stream keeps the node parsing
thousands of frames after the close, frames no one will read. Here, once the close is
sent, the peer may send at most :data:`AFTER_CLOSE_BYTES` more (room for its close reply
behind frames already in flight); past that the TCP connection is closed at once. A peer
that answers the close handshake normally sees no difference; one that goes on sending after
the close breaks the closing handshake (RFC 6455 section 5.5.1) and may see the connection
reset before it has read the close frame (1006 instead of the code sent).
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

#: Bytes a peer may still send after the server's close frame before its connection is
#: dropped: a close reply is at most 131 bytes, the rest covers frames already in flight.
AFTER_CLOSE_BYTES = 16 * 1024


class ClosingWebSocketProtocol(WebSocketsSansIOProtocol):
    """See the module docstring."""

    _after_close = 0

    def data_received(self, data: bytes) -> None:
        if self.close_sent and self.handshake_complete:
            self._after_close += len(data)
            if self._after_close > AFTER_CLOSE_BYTES:
                if not self.transport.is_closing():
                    self.transport.close()
                return
        super().data_received(data)
