"""Bodies and frames built to make the JSON depth check slow, against a real ``orbit-server``.

The depth check runs on the raw bytes before decoding (docs/security.md, "Hostile input").
It must take time linear in the size of what it reads, whatever the bytes are: a body of
escaped quotes that never closes its string (``"\\"[\\"[…``) once took seconds per 50 KB on
the event loop, with every other request of every tenant waiting. Each case here is a
1 MiB-class input answered with 400 well inside a bound that the quadratic check missed by
minutes, while another client's request is answered meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from reliability_support import (
    CliTenant,
    OrbitServer,
    open_session,
    put_queue,
    recv_json,
    ws_connect,
)
from reliability_support import fuzz_tenant as fuzz_tenant  # fixtures
from reliability_support import log_dir as log_dir
from reliability_support import server as server

pytestmark = pytest.mark.process

#: Just under the default 1 MiB body limit, so the depth check (not the size check) answers.
SIZE = 1_000_000
#: Generous for a linear pass over 1 MB (tens of milliseconds); the quadratic check needed
#: minutes for the same bodies.
BOUND_S = 5.0


def hostile_bodies() -> dict[str, bytes]:
    """Inputs that defeat naive string-skipping: unterminated strings of escapes, a lone
    trailing backslash, nothing but quotes, brackets inside escaped strings."""
    head = b'{"queue": "default", "kind": "'
    return {
        "escaped-quotes-unterminated": head + b'\\"[' * ((SIZE - len(head)) // 3),
        "escaped-quotes-trailing-backslash": head + b'\\"[' * ((SIZE - len(head)) // 3 - 1) + b"\\",
        "quotes-only": b'"' * SIZE,
        "escaped-backslashes": head + b"\\\\[" * ((SIZE - len(head)) // 3),
        "deep-brackets": b"[" * SIZE,
    }


@pytest.fixture(scope="module")
def tenant(server: OrbitServer, fuzz_tenant: CliTenant) -> CliTenant:
    return fuzz_tenant


@pytest.mark.parametrize("name", sorted(hostile_bodies()))
def test_hostile_body_is_refused_quickly_and_others_are_served(
    server: OrbitServer, tenant: CliTenant, name: str
) -> None:
    body = hostile_bodies()[name]
    others: list[float] = []

    def other_client() -> None:
        # Another client's cheap request while the hostile one is being read and checked.
        time.sleep(0.05)
        start = time.monotonic()
        r = httpx.get(server.url + "/healthz", timeout=BOUND_S * 4)
        assert r.status_code == 200
        others.append(time.monotonic() - start)

    thread = threading.Thread(target=other_client)
    thread.start()
    start = time.monotonic()
    r = httpx.post(
        f"{server.url}/v1/namespaces/{tenant.namespace}/tasks",
        content=body,
        headers={**tenant.auth, "Content-Type": "application/json"},
        timeout=BOUND_S * 4,
    )
    took = time.monotonic() - start
    thread.join(BOUND_S * 4)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_request"
    assert took < BOUND_S, f"{name}: {took:.2f}s"
    assert others and others[0] < BOUND_S, others


def test_worker_frames_check_depth_first_and_in_linear_time(
    server: OrbitServer, tenant: CliTenant
) -> None:
    put_queue(server.url, tenant, "depth-frames")
    session = open_session(server.url, tenant, ["depth-frames"])
    frames: dict[str, str] = {
        # ~1,000 levels: a decoder that recursed before the depth check answered `internal`.
        "nested-1000": '{"type": "heartbeat", "msg_id": "m", "attempt_ids": '
        + "[" * 1000
        + "]" * 1000
        + "}",
        "escaped-quotes": '{"type": "heartbeat", "msg_id": "' + '\\"[' * (SIZE // 3),
    }
    with ws_connect(server, session) as ws:
        for name, frame in frames.items():
            start = time.monotonic()
            ws.send(frame)
            reply = recv_json(ws, "error", timeout=BOUND_S * 4)
            took = time.monotonic() - start
            assert reply["code"] == "invalid_request", (name, reply)
            assert took < BOUND_S, f"{name}: {took:.2f}s"
        # The stream still answers a well-formed frame.
        ws.send(json.dumps({"type": "heartbeat", "msg_id": "ok", "attempt_ids": []}))
        assert recv_json(ws, "heartbeat_ok")["ref_msg_id"] == "ok"


def test_subscription_frames_check_depth_and_size_first(
    server: OrbitServer, tenant: CliTenant
) -> None:
    from websockets.sync.client import connect

    name = "depth-sub"
    r = httpx.put(
        f"{server.url}/v1/namespaces/{tenant.namespace}/subscriptions/{name}",
        json={"filter": {}, "start": "latest"},
        headers=tenant.auth,
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    url = f"{server.ws_url}/v1/namespaces/{tenant.namespace}/subscriptions/{name}/stream"
    with connect(url, additional_headers=tenant.auth, open_timeout=10, max_size=None) as ws:
        for frame in (
            '{"type": "ack", "delivery_id": ' + "[" * 1000 + "]" * 1000 + "}",
            '{"type": "ack", "proof": "' + '\\"[' * (SIZE // 3),
        ):
            start = time.monotonic()
            ws.send(frame)
            reply = _next(ws, "error")
            assert reply["code"] == "invalid_request", reply
            assert time.monotonic() - start < BOUND_S
        ws.send(json.dumps({"type": "ping"}))
        assert _next(ws, "pong")["type"] == "pong"


def _next(ws: Any, want: str) -> dict[str, Any]:
    end = time.monotonic() + BOUND_S * 4
    while True:
        frame = json.loads(ws.recv(timeout=max(0.1, end - time.monotonic())))
        if frame.get("type") == want:
            return frame  # type: ignore[no-any-return]
