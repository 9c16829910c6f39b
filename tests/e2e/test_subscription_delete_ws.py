"""Deleting a subscription while a consumer is connected over the WebSocket stream: the
stream ends (close code 1000) and nothing more is delivered; the deliveries stay as
history (a real uvicorn, tests/subscription_fixtures.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
from subscription_fixtures import LiveServer, append_results, make_tenant
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from orbit import subscriptions
from orbit.audit import CLI_ACTOR
from orbit.http.subscription_stream import StreamOptions
from orbit.storage import Database, Tx

FAST = StreamOptions(ping_interval_s=0.3, idle_timeout_s=30.0, poll_s=0.1)


@pytest.fixture(scope="module")
async def server(db: Database) -> AsyncIterator[LiveServer]:
    live = await LiveServer(db, options=FAST).start()
    try:
        yield live
    finally:
        await live.stop()


async def test_a_deleted_subscription_ends_its_streams(server: LiveServer, db: Database) -> None:
    t = await make_tenant(db)
    path = f"/v1/namespaces/{t.namespace}/subscriptions/live"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        r = await http.put(path, json={"filter": {}, "start": "earliest"}, headers=t.auth)
        assert r.status_code == 201
    await append_results(db, t.namespace_id, 1)
    async with connect(f"{server.ws_base}{path}/stream", additional_headers=t.auth,
                       compression=None) as ws:  # fmt: skip
        async with asyncio.timeout(10):
            while True:
                frame = msgspec.json.decode(await ws.recv())
                if frame["type"] == "delivery":
                    break
        await subscriptions.delete_subscription(db, CLI_ACTOR, t.namespace_id, "live")
        await append_results(db, t.namespace_id, 2)
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                while True:
                    frame = msgspec.json.decode(await ws.recv())
                    assert frame["type"] != "delivery", "delivered after the delete"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000

    async def count(tx: Tx) -> int:
        n = await tx.fetchval(  # rows, plus the slots of delivery ranges not moved out
            "SELECT (SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s)"
            " + (SELECT COALESCE(SUM(open_n + acked_n), 0) FROM orbit_delivery_ranges"
            "    WHERE namespace_id = %s)",
            (t.namespace_id, t.namespace_id),
        )
        return int(n)

    assert await db.read(count) == 1  # the one delivery stays as history
