"""Slow clients against a real ``orbit-server``.

Expected behaviour:

* **slow-loris HTTP**: connections that trickle request headers a byte at a time are closed
  by the server's header deadline (``--header-timeout``, default 10 s; uvicorn itself has
  none) and, while they last, other clients are served at normal speed;
* **a worker WebSocket that never reads**: the offers and replies the server pushes to it
  pile up in bounded socket buffers, never in server memory without bound, and the node's
  dispatcher keeps offering work to *other* sessions: one stuck socket stalls the node for at
  most one push deadline (``ORBIT_PULSE_SEND_TIMEOUT_MS``, default 10 s; 2 s here), then that
  socket is closed (1008) and its offers return to the queue by the normal offer-lease
  expiry. Before the fix in pulse/hub.py the healthy session waited until uvicorn's ping
  timeout (~40 s) dropped the stuck socket.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability_support import (
    OrbitServer,
    cli_tenant,
    get_task,
    open_session,
    put_queue,
    record_figures,
    recv_json,
    submit,
    ws_connect,
)
from reliability_support import log_dir as log_dir

from orbit.storage import DSN

pytestmark = pytest.mark.process

HEADER_TIMEOUT_S = 3
SEND_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def slow_server(dsn: DSN, log_dir: Path) -> Iterator[OrbitServer]:
    s = OrbitServer(dsn, log_dir, extra_args=["--header-timeout", str(HEADER_TIMEOUT_S)],
                    env={"ORBIT_PULSE_OFFER_LEASE_MS": "3000",
                         "ORBIT_PULSE_SEND_TIMEOUT_MS": str(SEND_TIMEOUT_S * 1000),
                         "ORBIT_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)})  # fmt: skip
    s.start()
    try:
        yield s
    finally:
        assert s.stop() == 0, s.logs()[-3000:]


@pytest.fixture(scope="module", params=["h11", "httptools"])
def head_server(request: pytest.FixtureRequest, dsn: DSN, log_dir: Path) -> Iterator[OrbitServer]:
    """A server with the short head deadline, once per HTTP parser (``--http``)."""
    if request.param == "httptools":
        pytest.importorskip("httptools", reason="httptools is not installed: scripts/install dev")
    s = OrbitServer(dsn, log_dir,
                    extra_args=["--header-timeout", str(HEADER_TIMEOUT_S), "--http", request.param])  # fmt: skip
    s.start()
    try:
        assert f"http {request.param}" in s.logs()  # the parser asked for serves
        yield s
    finally:
        assert s.stop() == 0, s.logs()[-3000:]


def _latency(url: str, n: int = 20) -> float:
    """Worst latency (s) of ``n`` fresh-connection GET /healthz."""
    worst = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        worst = max(worst, time.perf_counter() - t0)
    return worst


def test_slow_loris_connections_are_closed_and_others_are_served(head_server: OrbitServer) -> None:
    slow_server = head_server
    n = 200
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", slow_server.port), timeout=5)
        s.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    rss_with = slow_server.rss_kib()
    worst = 0.0
    closed = 0
    started = time.monotonic()
    deadline = started + HEADER_TIMEOUT_S * 3
    alive = list(socks)
    while alive and time.monotonic() < deadline:
        for s in list(alive):
            try:
                s.sendall(b"X")  # one more header byte: never completes the head
                s.setblocking(False)
                try:
                    if s.recv(1024) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except (ConnectionResetError, BrokenPipeError, OSError):
                alive.remove(s)
                closed += 1
        worst = max(worst, _latency(slow_server.url, 3))
        time.sleep(0.3)
    for s in socks:
        s.close()
    held = time.monotonic() - started
    record_figures("slow_loris", connections=n, closed_by_server=closed, seconds_held=round(held, 1),
                   worst_healthz_s=round(worst, 3), rss_kib=rss_with)  # fmt: skip
    assert closed == n, f"{n - closed} slow-loris connections still open after {held:.1f}s"
    assert held < HEADER_TIMEOUT_S * 3
    assert worst < 3.0  # served meanwhile (generous: CI machines run other suites too)


def test_a_complete_but_slow_request_head_is_within_the_deadline(head_server: OrbitServer) -> None:
    """The deadline covers the head only: a client that sends its head promptly and reads
    slowly is served normally, and keep-alive connections still work."""
    with httpx.Client(base_url=head_server.url) as c:
        for _ in range(3):
            assert c.get("/healthz").status_code == 200
            time.sleep(HEADER_TIMEOUT_S / 2)


def test_a_trickled_body_is_cut_off_at_the_body_deadline(
    slow_server: OrbitServer, dsn: DSN
) -> None:
    """A body sent a byte at a time gets 408 ``request_timeout`` once the body deadline
    passes, and the server closes the connection (it used to hold the socket for as long as
    the client kept trickling)."""
    t = cli_tenant(dsn)
    put_queue(slow_server.url, t, "trickle")
    s = socket.create_connection(("127.0.0.1", slow_server.port), timeout=5)
    s.sendall(f"POST /v1/namespaces/{t.namespace}/tasks HTTP/1.1\r\nHost: x\r\n"
              f"Authorization: Bearer {t.key}\r\nContent-Type: application/json\r\n"
              "Content-Length: 1000\r\n\r\n".encode())  # fmt: skip
    started = time.monotonic()
    answer = b""
    s.setblocking(False)
    try:
        while time.monotonic() - started < BODY_TIMEOUT_S * 5:
            try:
                s.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                chunk = s.recv(4096)
                if chunk == b"":
                    break  # closed by the server
                answer += chunk
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            time.sleep(0.2)
    finally:
        s.close()
    held = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert held < BODY_TIMEOUT_S * 4, f"the connection was held {held:.1f}s"
    record_figures("trickled_body", body_timeout_s=BODY_TIMEOUT_S, seconds_held=round(held, 1))


def _raw_ws(server: OrbitServer, path: str, token: str) -> socket.socket:
    """A WebSocket handshake on a raw socket with a tiny receive buffer; the caller never
    reads from it again (TCP back-pressure reaches the server at once)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def test_a_websocket_that_never_reads_does_not_stall_the_node(
    slow_server: OrbitServer, dsn: DSN
) -> None:
    t = cli_tenant(dsn)
    put_queue(slow_server.url, t, "stuck")
    put_queue(slow_server.url, t, "healthy")
    big = {"blob": "z" * 700_000}
    for _ in range(12):  # ~8 MiB of offers for the stuck worker: more than the socket buffers
        submit(slow_server.url, t, "stuck", payload=big)
    stuck = open_session(slow_server.url, t, ["stuck"], max_concurrency=64)
    raw = _raw_ws(slow_server, stuck.stream_path(), stuck.token)
    rss_before = slow_server.rss_kib()
    try:
        time.sleep(1.0)  # the dispatcher offers (and tries to push) the stuck queue's tasks
        healthy = open_session(slow_server.url, t, ["healthy"])
        with ws_connect(slow_server, healthy) as ws:
            task = submit(slow_server.url, t, "healthy")
            t0 = time.monotonic()
            offer = recv_json(ws, "offer", timeout=20)
            waited = time.monotonic() - t0
            assert offer["task"]["id"] == task["id"]
            ws.send(json.dumps({"type": "start", "msg_id": "1", "attempt_id": offer["attempt_id"]}))
            started = recv_json(ws, "started")
            ws.send(json.dumps({"type": "complete", "msg_id": "2", "attempt_id": offer["attempt_id"],
                                "execution_token": started["execution_token"]}))  # fmt: skip
            assert recv_json(ws, "receipt")["task_state"] == "SUCCEEDED"
        rss_after = slow_server.rss_kib()
        # The push to the stuck stream ends within one push deadline of its start: the stream
        # is closed (the healthy session did not have to wait for that: the node dispatch
        # round may serve it while the stuck push is still pending).
        deadline = time.monotonic() + SEND_TIMEOUT_S + 5.0
        while "stopped reading its stream" not in slow_server.logs():
            assert time.monotonic() < deadline, "the stuck stream was never closed"
            time.sleep(0.1)
    finally:
        raw.close()
    record_figures("ws_never_reads", offer_wait_s=round(waited, 3), rss_before_kib=rss_before,
                   rss_after_kib=rss_after)  # fmt: skip
    assert get_task(slow_server.url, t, task["id"])["state"] == "SUCCEEDED"
    # Bounded by one push deadline (then the stuck stream is closed), not by the stuck worker.
    assert waited < SEND_TIMEOUT_S + 2.0, f"the healthy session waited {waited:.1f}s for its offer"
    assert "stopped reading its stream" in slow_server.logs()
    assert rss_after - rss_before < 64 * 1024
