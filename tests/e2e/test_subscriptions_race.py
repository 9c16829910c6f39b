"""Several WebSocket connections and HTTP pulls racing on one subscription, over a real
uvicorn: ``max_in_flight`` holds across all of them at every moment, every event is acked
exactly once (an ack racing itself applies once and replays once), nothing is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from subscription_fixtures import LiveServer, SubTenant, append_results, make_tenant
from websockets.asyncio.client import connect

from orbit import subscriptions
from orbit.http.subscription_stream import StreamOptions
from orbit.storage import Database

FAST = StreamOptions(ping_interval_s=30.0, idle_timeout_s=60.0, poll_s=0.05)
EVENTS = 240
CAP = 6


@pytest.fixture
async def server(db: Database) -> AsyncIterator[LiveServer]:
    live = await LiveServer(db, options=FAST).start()
    try:
        yield live
    finally:
        await live.stop()


async def test_many_connections_and_pulls_keep_max_in_flight(
    server: LiveServer, db: Database
) -> None:
    t: SubTenant = await make_tenant(db)
    base = f"/v1/namespaces/{t.namespace}"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        r = await http.put(f"{base}/subscriptions/s", headers=t.auth,
                           json={"start": "earliest", "max_in_flight": CAP})  # fmt: skip
        assert r.status_code == 201, r.text
        for _ in range(EVENTS // 60):
            await append_results(db, t.namespace_id, 60)
        seen: dict[int, list[str]] = {}  # seq -> delivery ids handed out for it
        applied: list[str] = []
        done = asyncio.Event()
        peak = 0

        def note(d: dict[str, object]) -> None:
            seen.setdefault(int(d["seq"]), []).append(str(d["delivery_id"]))  # type: ignore[call-overload]

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                _, backlog = await subscriptions.get_subscription_with_backlog(
                    db, t.namespace_id, "s"
                )
                peak = max(peak, backlog.in_flight)
                if backlog.acked >= EVENTS:
                    done.set()
                await asyncio.sleep(0.01)

        async def ws_consumer() -> None:
            url = f"{server.ws_base}{base}/subscriptions/s/stream"
            async with connect(url, additional_headers=t.auth) as ws:
                while not done.is_set():
                    try:
                        async with asyncio.timeout(0.2):
                            frame = json.loads(await ws.recv())
                    except TimeoutError:
                        continue
                    if frame["type"] != "delivery":
                        continue
                    note(frame)
                    await ws.send(json.dumps({"type": "ack", "delivery_id": frame["delivery_id"],
                                              "proof": frame["proof"]}))  # fmt: skip

        async def pull_consumer() -> None:
            while not done.is_set():
                r = await http.post(f"{base}/subscriptions/s/pull", headers=t.auth,
                                    json={"max": 3, "wait_ms": 100})  # fmt: skip
                for d in r.json()["deliveries"]:
                    note(d)
                    path = f"{base}/deliveries/{d['delivery_id']}/ack"
                    body = {"proof": d["proof"]}
                    # the same ack twice at once: it applies once and replays once
                    a, b = await asyncio.gather(
                        http.post(path, json=body, headers=t.auth),
                        http.post(path, json=body, headers=t.auth),
                    )
                    outcomes = sorted([a.json()["outcome"], b.json()["outcome"]])
                    assert outcomes == ["applied", "replayed"], (a.text, b.text)
                    applied.append(d["delivery_id"])

        async with asyncio.timeout(120):
            await asyncio.gather(watch(), *(ws_consumer() for _ in range(3)),
                                 *(pull_consumer() for _ in range(2)))  # fmt: skip
        assert peak <= CAP
        assert sorted(seen) == list(range(1, EVENTS + 1))  # every event handed out
        # no delivery was handed out twice (every ack came in time), ids unique
        assert all(len(ids) == 1 for ids in seen.values()), {
            s: ids for s, ids in seen.items() if len(ids) > 1
        }
        assert len({i for ids in seen.values() for i in ids}) == EVENTS
        _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
        assert (backlog.acked, backlog.in_flight, backlog.pending) == (EVENTS, 0, 0)
        r = await http.get(f"{base}/subscriptions/s/deliveries", headers=t.auth,
                           params={"state": "ACKED", "limit": 500})  # fmt: skip
        items = r.json()["items"]
        assert [i["seq"] for i in items] == list(range(1, EVENTS + 1))
        assert all(i["attempts"] == 1 for i in items)
        assert applied  # the pulls took part


async def test_new_events_wake_an_idle_stream_without_polling(db: Database) -> None:
    """With the safety re-check a minute away, an idle stream still gets a new event at
    once: the node's loop sees the namespace's stream row move and wakes it. And a nacked
    delivery comes back when its backoff ends (the hand-out said when), not a minute later."""
    live = await LiveServer(db, options=StreamOptions(poll_s=60.0)).start()
    try:
        t = await make_tenant(db)
        base = f"/v1/namespaces/{t.namespace}"
        async with httpx.AsyncClient(base_url=live.base_url, timeout=30) as http:
            r = await http.put(f"{base}/subscriptions/s", headers=t.auth,
                               json={"start": "latest"})  # fmt: skip
            assert r.status_code == 201, r.text
        async with connect(f"{live.ws_base}{base}/subscriptions/s/stream",
                           additional_headers=t.auth) as ws:  # fmt: skip
            await asyncio.sleep(0.3)  # the stream is idle now, waiting
            await append_results(db, t.namespace_id, 1)
            async with asyncio.timeout(10):  # a minute without the wake
                frame = json.loads(await ws.recv())
            assert frame["type"] == "delivery" and frame["seq"] == 1
            await ws.send(json.dumps({"type": "nack", "delivery_id": frame["delivery_id"],
                                      "proof": frame["proof"], "retry_after_ms": 300}))  # fmt: skip
            async with asyncio.timeout(10):
                again = json.loads(await ws.recv())
            assert again["delivery_id"] == frame["delivery_id"] and again["attempt"] == 2
    finally:
        await live.stop()
