"""Ending a worker session, end to end (a real uvicorn with the Pulse loops, a raw WebSocket
client): ``DELETE …/workers/sessions/{sid}`` closes it in one transaction (offers released,
running attempts recovered like an expired session's, events written) and ends its stream;
a revoked credential or a session closed elsewhere ends an already open stream at its next
heartbeat (``error`` unauthenticated, close code 4401). docs/api/workers.md "Sessions"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import websockets
from event_rows import raw_events
from orbit_sdk.wire import SessionClosed
from platform_fixtures import add_key, bearer
from test_pulse_worker_ws import Live, Worker, get_task, open_session, stream_url, submit

from orbit.storage import Tx
from orbit.store import credentials as cred_store


@pytest.fixture
async def server(db) -> AsyncIterator[Live]:
    live = Live(db)
    await live.start()
    try:
        yield live
    finally:
        await live.stop()


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http, timeout=30) as c:
        yield c


def _session_path(t: Any, sid: str) -> str:
    return f"/v1/namespaces/{t.namespace}/workers/sessions/{sid}"


async def _close(http: httpx.AsyncClient, t: Any, created: dict[str, Any]) -> httpx.Response:
    return await http.delete(
        _session_path(t, created["session_id"]), headers=bearer(created["session_token"])
    )


async def _session_events(db, t, sid: str) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await raw_events(
            tx, t.namespace_id, subject_kind="worker_session", subject_id=bytes.fromhex(sid)
        )

    return await db.read(run)


async def _closed_with(ws: Any, within: float = 10) -> int | None:
    """Read until the server closes the socket; its close code."""
    try:
        async with asyncio.timeout(within):
            while True:
                await ws.recv()
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None


async def test_close_releases_offers_recovers_running_and_ends_the_stream(
    server, http, db, tenant
) -> None:
    t = await tenant(lease_ms=120_000)
    created = (await open_session(http, t, max_concurrency=3)).json()
    async with websockets.connect(
        stream_url(server, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        unsafe = await submit(http, t, payload={"n": 1})
        safe = await submit(http, t, payload={"n": 2}, retry_safe=True, max_attempts=3)
        offered = await submit(http, t, payload={"n": 3})
        offers = {}
        for _ in range(3):
            o = await w.recv("offer")
            offers[o["task"]["id"]] = o["attempt_id"]
        for task in (unsafe, safe):
            started = await w.call("start", attempt_id=offers[task["id"]])
            assert started["type"] == "started"
        r = await _close(http, t, created)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["state"] == "CLOSED" and body["closed_at"]
        # The SDK's type reads the answer (wire contract).
        assert msgspec.json.decode(r.content, type=SessionClosed).lost_attempts == 2
        assert (body["released_offers"], body["lost_attempts"]) == (1, 2)
        assert await _closed_with(ws) == 4401
    # The offered task is back in its queue; the running ones follow the recovery rules.
    assert (await get_task(http, t, offered["id"]))["state"] in ("WAITING", "LEASED")
    assert (await get_task(http, t, offered["id"]))["attempts"] == 0
    u = await get_task(http, t, unsafe["id"])
    assert u["state"] == "NEEDS_REVIEW" and u["effect_uncertain"] is True
    assert u["error"]["reason"] == "session_closed"
    s = await get_task(http, t, safe["id"])
    assert s["state"] in ("WAITING", "LEASED") and s["attempts"] == 1
    assert s["effect_uncertain"] is False
    events = await _session_events(db, t, created["session_id"])
    closed = [e for e in events if e["type"] == "worker.session_closed"]
    assert len(closed) == 1
    assert msgspec.json.decode(closed[0]["data"]) == {"released_offers": 1, "lost_attempts": 2}
    # The token is dead for everything else; closing again is a 200 no-op.
    r = await http.post(
        _session_path(t, created["session_id"]) + "/heartbeat",
        headers=bearer(created["session_token"]),
    )
    assert r.status_code == 401
    again = await _close(http, t, created)
    assert again.status_code == 200
    assert again.json() == {**body, "released_offers": 0, "lost_attempts": 0}
    assert len([e for e in await _session_events(db, t, created["session_id"])
                if e["type"] == "worker.session_closed"]) == 1  # fmt: skip


async def test_close_needs_the_sessions_own_token(server, http, tenant) -> None:
    t = await tenant()
    created = (await open_session(http, t)).json()
    other = (await open_session(http, t)).json()
    path = _session_path(t, created["session_id"])
    for headers in (
        {},
        bearer("nope"),
        bearer(other["session_token"]),  # another session's token
        bearer(t.key),  # an API key is not a session token
    ):
        r = await http.delete(path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
    t2 = await tenant()
    r = await http.delete(
        f"/v1/namespaces/{t2.namespace}/workers/sessions/{created['session_id']}",
        headers=bearer(created["session_token"]),
    )
    assert r.status_code == 401
    # Still active: a heartbeat works.
    r = await http.post(path + "/heartbeat", headers=bearer(created["session_token"]))
    assert r.status_code == 200


async def test_revoked_credential_ends_an_open_stream_at_its_next_heartbeat(
    server, http, db, tenant
) -> None:
    t = await tenant()
    cred_id, key = await add_key(db, t, ["workers.connect"])  # type: ignore[arg-type]
    created = (await open_session(http, t, key=key)).json()
    async with websockets.connect(
        stream_url(server, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        assert (await w.call("heartbeat", attempt_ids=[]))["type"] == "heartbeat_ok"

        async def revoke(tx: Tx) -> bool:
            row = await cred_store.credential_get(tx, cred_id)
            assert row is not None
            return await cred_store.credential_revoke_if_revision(tx, cred_id, row.revision, None)

        assert await db.transaction(revoke)
        reply = await w.call("heartbeat", attempt_ids=[])
        assert reply["type"] == "error" and reply["code"] == "unauthenticated"
        assert await _closed_with(ws) == 4401
    # A new stream with that session token is refused before the upgrade.
    with pytest.raises(websockets.InvalidStatus) as err:
        async with websockets.connect(
            stream_url(server, t, created["session_id"]),
            additional_headers=bearer(created["session_token"]),
        ):
            pass
    assert err.value.response.status_code == 401


async def test_a_session_closed_elsewhere_ends_its_stream_at_the_next_heartbeat(
    server, http, db, tenant
) -> None:
    """The close reached another node (here: the database changed behind this node's back,
    as a close handled by another server process does): the open stream ends at its next
    heartbeat."""
    from pulse import sessions

    t = await tenant()
    created = (await open_session(http, t)).json()
    async with websockets.connect(
        stream_url(server, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        assert (await w.call("heartbeat", attempt_ids=[]))["type"] == "heartbeat_ok"
        answer, _ = await sessions.close_session(
            db, t.namespace_id, bytes.fromhex(created["session_id"])
        )
        assert answer.state == "CLOSED"
        reply = await w.call("heartbeat", attempt_ids=[])
        assert reply["type"] == "error" and reply["code"] == "unauthenticated"
        assert await _closed_with(ws) == 4401
