"""The demo gets its console port back at once when it is run again."""

from __future__ import annotations

import socket

from orbit_cmd.demo import _port_is_free


def _listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, int(s.getsockname()[1])


def test_a_port_whose_server_closed_its_connections_is_free_again() -> None:
    # A previous demo's server: it served one connection and closed it first, so the port
    # holds a TIME_WAIT connection for about a minute after the server is gone.
    server, port = _listener()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()
    client.close()
    server.close()
    assert _port_is_free(port)


def test_a_port_something_listens_on_is_not_free() -> None:
    server, port = _listener()
    try:
        assert not _port_is_free(port)
    finally:
        server.close()
