"""A worker stream closed for its budget stops being read (cmd/orbit_cmd/ws_protocol.py).

A flooding peer that ignores the server's close frame keeps sending; uvicorn alone would
parse every one of those frames for up to its 10 s close timeout only to discard them. The
server here reads at most 16 KiB after its close, then drops the TCP connection (the
peer's sends fail or it reads the end of the stream at once, not after the close timeout).
A peer that answers the close handshake closes cleanly.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from reliability_support import (
    CliTenant,
    OrbitServer,
    Session,
    cli_tenant,
    open_session,
    put_queue,
    ws_connect,
)
from reliability_support import log_dir as log_dir
from reliability_support import server as server  # fixtures
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close
from websockets.http11 import Response
from websockets.uri import parse_uri

from orbit.storage import DSN

pytestmark = pytest.mark.process

HEARTBEAT = b'{"type": "heartbeat", "msg_id": "h", "attempt_ids": []}'


def _masked_text(payload: bytes) -> bytes:
    """One masked client text frame (RFC 6455 section 5.2), built by hand: the sans-I/O
    client refuses to send after a close, which is exactly what a flooding peer does."""
    mask = os.urandom(4)
    head = bytes([0x81])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawStream:
    """A worker stream on a plain socket, driven by the sans-I/O ``websockets`` client: the
    test decides what is sent, and never sends the close reply."""

    def __init__(self, server: OrbitServer, s: Session) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self.proto = ClientProtocol(parse_uri(server.ws_url + s.stream_path()), max_size=None)
        request = self.proto.connect()
        request.headers["Authorization"] = f"Bearer {s.token}"
        self.proto.send_request(request)
        self.sock.sendall(b"".join(self.proto.data_to_send()))
        self.events: list[Any] = []
        while not any(isinstance(e, Response) for e in self.events):
            self._pump()
        response = next(e for e in self.events if isinstance(e, Response))
        assert response.status_code == 101, response

    def _pump(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.proto.receive_data(data)
        self.events.extend(self.proto.events_received())
        self.proto.data_to_send()  # dropped: no pong, no close reply
        return True

    def wait_for_close(self) -> Close | None:
        while self.proto.close_rcvd is None and self._pump():
            pass
        return self.proto.close_rcvd


@pytest.fixture()
def session(server: OrbitServer, dsn: DSN) -> Iterator[tuple[CliTenant, Session]]:
    t = cli_tenant(dsn)
    put_queue(server.url, t, "after-close")
    yield t, open_session(server.url, t, ["after-close"])


def test_a_peer_that_ignores_the_close_is_cut_off(
    server: OrbitServer, session: tuple[CliTenant, Session]
) -> None:
    _, s = session
    stream = RawStream(server, s)
    # Far over the session's heartbeat budget: the server answers rate_limited and 1008.
    stream.sock.sendall(_masked_text(HEARTBEAT) * 200)
    close = stream.wait_for_close()
    assert close is not None and close.code == 1008, close
    # The peer goes on as if nothing happened: 240 KiB more of heartbeats, no close reply.
    chunk = _masked_text(HEARTBEAT) * 1000  # about 60 KiB
    stream.sock.settimeout(5.0)  # well under uvicorn's 10 s wait for a close reply
    try:
        for _ in range(4):
            stream.sock.sendall(chunk)
        while stream.sock.recv(65536):  # until the server's FIN
            pass
        outcome = "dropped"
    except TimeoutError:  # before: uvicorn went on reading (and discarding) every frame
        outcome = "still read"
    except OSError:  # reset / broken pipe
        outcome = "dropped"
    assert outcome == "dropped"
    stream.sock.close()
    assert server.alive()


def test_a_peer_that_answers_the_close_closes_cleanly(
    server: OrbitServer, session: tuple[CliTenant, Session]
) -> None:
    _, s = session
    ws = ws_connect(server, s)
    try:
        with pytest.raises(ConnectionClosed) as closed:
            for i in range(200):
                ws.send(HEARTBEAT.decode().replace('"h"', f'"h{i}"'))
            while True:
                ws.recv(timeout=10)
    finally:
        ws.close()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert closed.value.sent is not None and closed.value.sent.code == 1008  # the reply went out
