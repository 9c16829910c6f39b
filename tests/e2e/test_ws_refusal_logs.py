"""A WebSocket upgrade the server refuses with an HTTP error (a worker stream with an expired
or closed session's token, a subscription stream with a wrong key) is a normal event: a real
``orbit-server`` logs it once, at info, with the status, code and reason — never uvicorn's
``ASGI callable returned without completing handshake.`` at error level."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import websockets
from platform_fixtures import ServerProcess, bearer, new_tenant, unique

from orbit.storage import DSN, Database

HANDSHAKE_ERROR = "ASGI callable returned without completing handshake"


async def _refused(url: str, headers: dict[str, str]) -> int:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with websockets.connect(url, additional_headers=headers, open_timeout=10):
            pass
    return info.value.response.status_code


async def test_a_refused_stream_is_logged_once_at_info_with_its_reason(
    dsn: DSN, db: Database
) -> None:
    server = ServerProcess(dsn, "--log-level", "info")
    try:
        await asyncio.to_thread(server.wait_ready)
        t = await new_tenant(db)
        queue = unique("q")
        base = f"/v1/namespaces/{t.namespace}"
        ws_base = server.url.replace("http://", "ws://") + base
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            r = await http.put(f"{base}/queues/{queue}", json={}, headers=bearer(t.key))
            assert r.status_code in (200, 201), r.text
            body = {
                "instance": {"host": "h", "pid": 1, "sdk": "raw/0"},
                "queues": [queue],
                "max_concurrency": 1,
            }
            r = await http.post(f"{base}/workers/sessions", json=body, headers=bearer(t.key))
            assert r.status_code == 201, r.text
            sid, token = r.json()["session_id"], r.json()["session_token"]
            r = await http.delete(f"{base}/workers/sessions/{sid}", headers=bearer(token))
            assert r.status_code in (200, 204), r.text
        # The closed session's token, as a worker whose session ended presents it.
        status = await _refused(f"{ws_base}/workers/sessions/{sid}/stream", bearer(token))
        assert status == 401
        wrong = bearer("orb_" + "0" * 32 + "_nope")
        assert await _refused(f"{ws_base}/subscriptions/s/stream", wrong) == 401
    finally:
        server.proc.terminate()
        _, err = server.proc.communicate(timeout=30)
    assert HANDSHAKE_ERROR not in err, err
    lines = [line for line in err.splitlines() if "/stream" in line]
    worker = [line for line in lines if f"/workers/sessions/{sid}/stream" in line]
    subscription = [line for line in lines if "/subscriptions/s/stream" in line]
    assert len(worker) == 1 and len(subscription) == 1, lines
    for line in worker + subscription:
        assert line.startswith("INFO "), line
        assert "401 unauthenticated" in line, line
    assert "session" in worker[0].split("unauthenticated", 1)[1], worker[0]
    assert not [line for line in err.splitlines() if line.startswith(("ERROR", "CRITICAL"))], err
