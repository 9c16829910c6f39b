"""Subscriptions end to end over a real uvicorn: HTTP config/pull/ack/nack/budget/history,
the WebSocket stream (flow control, bad proofs, resume, slow readers, keep-alive, auth),
the SDK's Subscriber and SyncSubscriber, and the frame contract between server and SDK."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from orbit_sdk import Subscriber, SyncSubscriber
from orbit_sdk import subscriber as sdk_wire
from subscription_fixtures import LiveServer, SubTenant, append_results, make_key, make_tenant
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from orbit import delivery_gauges, delivery_history, delivery_pump
from orbit.http import subscription_stream as server_wire
from orbit.http.subscription_stream import StreamOptions
from orbit.storage import Database

FAST = StreamOptions(ping_interval_s=0.3, idle_timeout_s=5.0, poll_s=0.1)


@pytest.fixture(scope="module")
async def server(db: Database) -> AsyncIterator[LiveServer]:
    live = await LiveServer(db, options=FAST).start()
    try:
        yield live
    finally:
        await live.stop()


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        yield client


def sub_path(t: SubTenant, name: str = "s") -> str:
    return f"/v1/namespaces/{t.namespace}/subscriptions/{name}"


async def create_sub(
    http: httpx.AsyncClient, t: SubTenant, name: str = "s", **body: Any
) -> dict[str, Any]:
    body.setdefault("start", "earliest")
    r = await http.put(sub_path(t, name), json=body, headers=t.auth)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def ws_connect(
    server: LiveServer, t: SubTenant, name: str = "s", **kw: Any
) -> ClientConnection:
    return await connect(
        f"{server.ws_base}{sub_path(t, name)}/stream",
        additional_headers=t.auth,
        compression=None,
        **kw,
    )


async def recv_json(ws: ClientConnection, within: float = 5.0) -> dict[str, Any]:
    """The next frame that is not a ping (pings are answered), within ``within`` seconds."""
    async with asyncio.timeout(within):
        while True:
            frame = msgspec.json.decode(await ws.recv())
            if frame["type"] != "ping":
                return frame  # type: ignore[no-any-return]
            await ws.send('{"type": "pong"}')


async def recv_deliveries(
    ws: ClientConnection, n: int, within: float = 5.0
) -> list[dict[str, Any]]:
    out = [await recv_json(ws, within) for _ in range(n)]
    assert all(f["type"] == "delivery" for f in out), out
    return out


async def no_delivery_within(ws: ClientConnection, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        frame = await recv_json(ws, seconds)
        raise AssertionError(f"unexpected frame {frame}")


# ----------------------------------------------------------------------------- HTTP


async def test_put_get_etag_and_auth(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    path = sub_path(t)
    r = await http.put(
        path, json={"filter": {"queues": ["q"]}, "start": "earliest"}, headers=t.auth
    )
    assert (r.status_code, r.headers["etag"], r.json()["revision"]) == (201, '"1"', 1)
    r = await http.put(path, json={"start": "earliest"}, headers={**t.auth, "If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["error"]["code"] == "precondition_failed"
    r = await http.put(path, json={"max_in_flight": 2}, headers={**t.auth, "If-Match": '"9"'})
    assert r.status_code == 412
    r = await http.put(path, json={"max_in_flight": 2}, headers={**t.auth, "If-Match": '"1"'})
    assert (r.status_code, r.headers["etag"]) == (200, '"2"')
    r = await http.put(path, json={"max_in_flight": 2}, headers=t.auth)
    assert (r.status_code, r.headers["etag"]) == (200, '"2"')  # no-op
    r = await http.put(path, json={"start": "latest"}, headers=t.auth)
    assert r.status_code == 409
    r = await http.put(path, json={"max_in_flight": 0}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "max_in_flight"
    r = await http.put(path, json={"nope": 1}, headers=t.auth)
    assert r.status_code == 400

    await append_results(db, t.namespace_id, 3, queue="q")
    await append_results(db, t.namespace_id, 1, queue="other")
    r = await http.get(path, headers=t.auth)
    body = r.json()
    assert r.status_code == 200 and r.headers["etag"] == '"2"'
    assert body["filter"] == {"queues": ["q"]} and body["max_in_flight"] == 2
    assert body["backlog"]["last_seq"] == 4
    assert body["backlog"]["pending"] + body["backlog"]["unscanned_events"] >= 3

    consume_only = await make_key(db, t, ["subscriptions.consume"])
    manage_only = await make_key(db, t, ["subscriptions.manage"])
    nothing = await make_key(db, t, ["tasks.read"])
    bearer = lambda k: {"Authorization": f"Bearer {k}"}  # noqa: E731
    assert (await http.put(path, json={}, headers=bearer(consume_only))).status_code == 403
    assert (await http.get(path, headers=bearer(consume_only))).status_code == 200
    assert (await http.get(path, headers=bearer(manage_only))).status_code == 200
    assert (await http.get(path, headers=bearer(nothing))).status_code == 403
    assert (await http.get(path, headers={"Authorization": "Bearer orb_x"})).status_code == 401
    assert (await http.get(sub_path(t, "absent"), headers=t.auth)).status_code == 404
    other = await make_tenant(db)
    r = await http.get(f"/v1/namespaces/{t.namespace}/subscriptions/s", headers=other.auth)
    assert r.status_code == 404  # same namespace name, other application: not visible

    r = await http.put(sub_path(t, "defaults"), headers=t.auth)  # no body: every default
    assert r.status_code == 201
    assert (r.json()["start"], r.json()["max_in_flight"], r.json()["position"]) == (
        "latest",
        100,
        4,
    )
    r = await http.post(f"{sub_path(t, 'defaults')}/pull", headers=t.auth)
    assert r.json() == {"deliveries": []}


async def test_pull_long_poll_ack_nack_budget_history(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t, max_deliveries=1)
    pull = f"{sub_path(t)}/pull"
    started = asyncio.get_running_loop().time()
    r = await http.post(pull, json={"max": 5, "wait_ms": 200}, headers=t.auth)
    assert r.json() == {"deliveries": []}
    assert asyncio.get_running_loop().time() - started >= 0.19

    async def produce_later() -> None:
        await asyncio.sleep(0.3)
        await append_results(db, t.namespace_id, 2, result={"n": 1.10})

    producer = asyncio.create_task(produce_later())
    r = await http.post(pull, json={"max": 5, "wait_ms": 10_000}, headers=t.auth)
    await producer
    got = r.json()["deliveries"]
    if len(got) < 2:  # the two events may be pumped in two rounds
        r = await http.post(pull, json={"max": 5, "wait_ms": 2_000}, headers=t.auth)
        got += r.json()["deliveries"]
    assert [d["seq"] for d in got] == [1, 2]
    first, second = got
    assert first["event"]["type"] == "task.succeeded" and first["event"]["seq"] == 1
    assert b'"result":{"n":1.10}' in r.content or first["event"]["result"] == {"n": 1.1}
    ns = f"/v1/namespaces/{t.namespace}/deliveries"
    r = await http.post(f"{ns}/{first['delivery_id']}/ack", json={"proof": "wrong"}, headers=t.auth)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "stale_proof")
    r = await http.post(
        f"{ns}/{first['delivery_id']}/ack", json={"proof": first["proof"]}, headers=t.auth
    )
    assert r.json()["outcome"] == "applied"
    r = await http.post(
        f"{ns}/{first['delivery_id']}/ack", json={"proof": first["proof"]}, headers=t.auth
    )
    assert r.json()["outcome"] == "replayed"
    r = await http.post(
        f"{ns}/{second['delivery_id']}/nack", json={"proof": second["proof"], "retry_after_ms": 0},
        headers=t.auth,
    )  # fmt: skip
    assert r.json()["state"] == "EXHAUSTED"  # budget 1 spent
    r = await http.get(f"{sub_path(t)}/deliveries?state=EXHAUSTED", headers=t.auth)
    assert [i["delivery_id"] for i in r.json()["items"]] == [second["delivery_id"]]
    consume_only = await make_key(db, t, ["subscriptions.consume"])
    r = await http.post(
        f"{ns}/{second['delivery_id']}/budget", json={"add": 1},
        headers={"Authorization": f"Bearer {consume_only}"},
    )  # fmt: skip
    assert r.status_code == 403  # budget needs subscriptions.manage
    idem = {**t.auth, "Idempotency-Key": "budget-1"}
    r = await http.post(f"{ns}/{second['delivery_id']}/budget", json={"add": 1}, headers=idem)
    assert (r.json()["state"], r.json()["attempts"], r.json()["budget"]) == ("PENDING", 1, 2)
    retry = await http.post(f"{ns}/{second['delivery_id']}/budget", json={"add": 1}, headers=idem)
    assert retry.headers.get("idempotent-replayed") == "true" and retry.json() == r.json()
    r = await http.post(f"{ns}/{second['delivery_id']}/budget", json={"add": 2}, headers=idem)
    assert r.status_code == 422  # same key, other request
    r = await http.post(pull, json={"max": 5, "wait_ms": 2_000}, headers=t.auth)
    (again,) = r.json()["deliveries"]
    assert again["delivery_id"] == second["delivery_id"] and again["attempt"] == 2
    assert again["proof"] != second["proof"]
    r = await http.post(f"{ns}/{'0' * 32}/ack", json={"proof": "x"}, headers=t.auth)
    assert r.status_code == 404
    r = await http.post(f"{ns}/nothex/ack", json={"proof": "x"}, headers=t.auth)
    assert r.status_code == 404

    # History: cursor pagination over every state.
    r1 = (await http.get(f"{sub_path(t)}/deliveries?limit=1", headers=t.auth)).json()
    assert len(r1["items"]) == 1 and r1["next_cursor"]
    r2 = (
        await http.get(
            f"{sub_path(t)}/deliveries?limit=1&cursor={r1['next_cursor']}", headers=t.auth
        )
    ).json()
    assert [i["seq"] for i in r1["items"] + r2["items"]] == [1, 2]
    assert "proof" not in r2["items"][0]
    r = await http.get(
        f"{sub_path(t)}/deliveries?limit=1&state=ACKED&cursor={r1['next_cursor']}", headers=t.auth
    )
    assert r.status_code == 400  # a cursor is bound to its filters


# ----------------------------------------------------------------------------- WebSocket


async def test_ws_flow_control_ack_and_bad_proof(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t, max_in_flight=3)
    await append_results(db, t.namespace_id, 10)
    async with await ws_connect(server, t) as ws:
        got = await recv_deliveries(ws, 3)
        assert [d["seq"] for d in got] == [1, 2, 3]
        await no_delivery_within(ws, 0.5)  # never more than max_in_flight unacked
        await ws.send(
            msgspec.json.encode(
                {"type": "ack", "delivery_id": got[0]["delivery_id"], "proof": got[0]["proof"]}
            )
        )
        (d4,) = await recv_deliveries(ws, 1)  # the ack gets no reply; a slot opens
        assert d4["seq"] == 4
        await ws.send(
            msgspec.json.encode(
                {"type": "ack", "delivery_id": got[1]["delivery_id"], "proof": "bad"}
            )
        )
        err = await recv_json(ws)
        assert err == {
            "type": "error", "code": "stale_proof", "message": err["message"], "ref": got[1]["delivery_id"],
        }  # fmt: skip
        await ws.send('{"type": "bogus"}')
        assert (await recv_json(ws))["code"] == "invalid_request"
        await ws.send('{"type": "ping"}')
        assert (await recv_json(ws))["type"] == "pong"
        await ws.send(
            msgspec.json.encode(
                {
                    "type": "nack",
                    "delivery_id": got[1]["delivery_id"],
                    "proof": got[1]["proof"],
                    "retry_after_ms": 0,
                }
            )
        )
        # Due order is (next_at, seq): the nacked one (due now) queues behind seq 5..10,
        # which were due since the pump. Ack what comes until it is redelivered.
        for _ in range(10):
            (d,) = await recv_deliveries(ws, 1)
            if d["delivery_id"] == got[1]["delivery_id"]:
                break
            ack = {"type": "ack", "delivery_id": d["delivery_id"], "proof": d["proof"]}
            await ws.send(msgspec.json.encode(ack))
        assert d["delivery_id"] == got[1]["delivery_id"] and d["attempt"] == 2
        assert d["proof"] != got[1]["proof"]
        # Every connection of the server kept within its bound.
        (conn,) = [c for c in server.streams if c.sub.namespace_id == t.namespace_id]
        assert conn.stats.max_unacked <= 3 and conn.stats.max_queue <= conn.capacity


async def test_ws_resume_after_reconnect(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t, max_in_flight=4, ack_timeout_ms=60_000)
    await append_results(db, t.namespace_id, 4)
    async with await ws_connect(server, t) as ws:
        got = await recv_deliveries(ws, 4)
        for d in got[:2]:
            await ws.send(
                msgspec.json.encode(
                    {"type": "ack", "delivery_id": d["delivery_id"], "proof": d["proof"]}
                )
            )
        await ws.send('{"type": "ping"}')  # frames are handled in order: acks are applied
        assert (await recv_json(ws))["type"] == "pong"
    # Unacked ones come back at once on a new connection (lease was 60 s), acked never.
    async with await ws_connect(server, t) as ws:
        again = await recv_deliveries(ws, 2, within=3.0)
        assert sorted(d["seq"] for d in again) == [3, 4]
        assert {d["delivery_id"] for d in again} == {d["delivery_id"] for d in got[2:]}
        assert all(d["attempt"] == 2 for d in again)
        assert {d["proof"] for d in again}.isdisjoint(d["proof"] for d in got)
        await no_delivery_within(ws, 0.5)


async def test_ws_slow_reader_keeps_server_memory_bounded(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t, max_in_flight=5)
    big = {"blob": "x" * 100_000}
    for _ in range(3):
        await append_results(db, t.namespace_id, 20, result=big)  # 60 events, ~6 MB
    # A client that never reads: websockets stops reading the socket once 1 frame is queued.
    ws = await ws_connect(server, t, max_queue=1, max_size=None, close_timeout=0.5)
    try:
        await asyncio.sleep(1.5)
        (conn,) = [c for c in server.streams if c.sub.namespace_id == t.namespace_id]
        assert conn.stats.leased == 5  # not one more than max_in_flight was taken
        assert conn.stats.max_unacked <= 5
        assert conn.stats.max_queue <= conn.capacity == 5 + server_wire.CONTROL_SLOTS
        batch = await delivery_pump.lease(db, t.namespace_id, conn.sub.id, 100)
        assert batch.deliveries == [] and batch.in_flight == 5  # the cap is the subscription's
    finally:
        await ws.close()


async def test_ws_keepalive_closes_idle_client_and_releases(db: Database) -> None:
    live = await LiveServer(
        db, options=StreamOptions(ping_interval_s=0.1, idle_timeout_s=0.6, poll_s=0.1)
    ).start()
    try:
        t = await make_tenant(db)
        async with httpx.AsyncClient(base_url=live.base_url) as http:
            await create_sub(http, t, ack_timeout_ms=60_000)
        await append_results(db, t.namespace_id, 1)
        # A client that answers pings stays connected well past the idle timeout.
        async with await ws_connect(live, t) as ws:
            (d,) = await recv_deliveries(ws, 1)
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.5
            while loop.time() < end:
                with contextlib.suppress(TimeoutError):
                    await recv_json(ws, 0.2)  # answers pings
        # A silent client is closed with 4408 and its delivery is given back at once.
        # (The first connection's release may land just after this one connects: pings can
        # come first, and are not answered.)
        ws = await ws_connect(live, t, ping_interval=None)
        async with asyncio.timeout(5):
            frame = {"type": "ping"}
            while frame["type"] == "ping":
                frame = msgspec.json.decode(await ws.recv())
        assert frame["type"] == "delivery" and frame["attempt"] == 2
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        assert (
            closed.value.rcvd is not None and closed.value.rcvd.code == server_wire.IDLE_CLOSE_CODE
        )
        info = await delivery_history.get_delivery(
            db, t.namespace_id, msgspec.convert(bytes.fromhex(d["delivery_id"]), bytes)
        )
        assert info.state == "PENDING" and info.attempts == 2
    finally:
        await live.stop()


async def test_ws_refuses_bad_key_missing_action_unknown_subscription(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t)
    submit_only = await make_key(db, t, ["tasks.submit"])
    for headers, name in (
        ({"Authorization": "Bearer nope"}, "s"),
        ({"Authorization": f"Bearer {submit_only}"}, "s"),
        (t.auth, "absent"),
    ):
        with pytest.raises((InvalidStatus, ConnectionClosed)):
            async with connect(
                f"{server.ws_base}{sub_path(t, name)}/stream", additional_headers=headers
            ) as ws:
                await asyncio.wait_for(ws.recv(), 5)


# ----------------------------------------------------------------------------- SDK


async def test_sdk_subscriber_acks_and_resumes_after_server_side_drop(
    server: LiveServer, http: httpx.AsyncClient, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="orbit_sdk")
    t = await make_tenant(db)
    proofs: list[str] = []
    await create_sub(http, t, max_in_flight=2, ack_timeout_ms=60_000)
    await append_results(db, t.namespace_id, 6)
    seen: list[tuple[int, int]] = []
    async with Subscriber(server.base_url, t.key, t.namespace, "s") as sub:
        async for d in sub:
            seen.append((d.seq, d.attempt))
            proofs.append(d._proof)
            assert d.event.seq == d.seq and t.key not in repr(sub) and "proof" not in repr(d)
            if d.seq == 3 and d.attempt == 1:
                # Drop the connection from the server side without acking seq 3.
                for conn in [c for c in server.streams if c.sub.namespace_id == t.namespace_id]:
                    await conn.ws.close(code=1012)
                continue
            assert await d.ack()
            if len({s for s, _ in seen}) == 6 and (3, 2) in seen:
                break
        assert sub.stats.connects >= 2 and sub.stats.acks >= 6
    assert (3, 2) in seen  # redelivered after the reconnect
    logged = caplog.text  # DEBUG logs of the SDK and of websockets (frames, handshake)
    assert "subscription stream open" in logged and "> TEXT" in logged
    assert t.key not in logged and not any(p in logged for p in proofs)
    # A WebSocket ack has no reply: the server applies it shortly after it was sent.
    for _ in range(300):
        r = await http.get(sub_path(t), headers=t.auth)
        if r.json()["backlog"]["acked"] == 6:
            break
        await asyncio.sleep(0.1)
    assert r.json()["backlog"]["acked"] == 6


async def test_sdk_subscriber_stops_on_refused_key(server: LiveServer, db: Database) -> None:
    t = await make_tenant(db)
    sub = Subscriber(server.base_url, "orb_bad", t.namespace, "s")
    with pytest.raises(Exception) as err:
        async with asyncio.timeout(10):
            async for _ in sub:
                pass
    await sub.aclose()
    assert getattr(err.value, "status", None) in (401, 403, 404)


async def test_sync_subscriber_pulls_and_acks(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t)
    await append_results(db, t.namespace_id, 3)

    def consume() -> list[int]:
        seqs: list[int] = []
        with SyncSubscriber(server.base_url, t.key, t.namespace, "s", wait_ms=2_000) as sub:
            for d in sub:
                assert d.ack() is True
                seqs.append(d.event.seq)
                if len(seqs) == 3:
                    break
            assert sub.pull(wait_ms=0) == []
        return seqs

    assert sorted(await asyncio.to_thread(consume)) == [1, 2, 3]


def test_frame_contract_server_and_sdk_agree() -> None:
    """Each side decodes exactly what the other encodes (the SDK keeps its own wire types)."""
    enc = msgspec.json.Encoder()
    frame = server_wire.DeliveryFrame(
        delivery_id="a" * 32, seq=7, event_id="b" * 32, proof="p", event=msgspec.Raw(b'{"seq":7}'),
        attempt=2, lease_expires_at="2026-01-01T00:00:00.000000Z",
    )  # fmt: skip
    got = sdk_wire.SERVER_DECODER.decode(enc.encode(frame))
    assert isinstance(got, sdk_wire.DeliveryFrame) and (got.seq, got.attempt, bytes(got.event)) == (
        7,
        2,
        b'{"seq":7}',
    )
    err = sdk_wire.SERVER_DECODER.decode(server_wire.error_frame("stale_proof", "m", "x"))
    assert isinstance(err, sdk_wire.ErrorFrame) and (err.code, err.ref) == ("stale_proof", "x")
    assert isinstance(sdk_wire.SERVER_DECODER.decode(server_wire._PING), sdk_wire.PingFrame)
    for client in (
        sdk_wire.AckFrame(delivery_id="a" * 32, proof="p"),
        sdk_wire.NackFrame(delivery_id="a" * 32, proof="p", retry_after_ms=5),
        sdk_wire.NackFrame(delivery_id="a" * 32, proof="p"),
        sdk_wire.PongFrame(),
    ):
        decoded = server_wire._DECODE_CLIENT.decode(sdk_wire.encode(client))
        assert type(decoded).__name__ == type(client).__name__
        assert msgspec.structs.asdict(decoded) == msgspec.structs.asdict(client)


async def test_metrics_count_open_deliveries(
    server: LiveServer, http: httpx.AsyncClient, db: Database
) -> None:
    t = await make_tenant(db)
    await create_sub(http, t, max_deliveries=1)
    await append_results(db, t.namespace_id, 2)
    r = await http.post(f"{sub_path(t)}/pull", json={"max": 1, "wait_ms": 2_000}, headers=t.auth)
    (d,) = r.json()["deliveries"]
    await http.post(
        f"/v1/namespaces/{t.namespace}/deliveries/{d['delivery_id']}/nack",
        json={"proof": d["proof"]},
        headers=t.auth,
    )
    # What the server's background refresh does (a page of subscriptions per round).
    await delivery_gauges.install(server.ctx.metrics, db).refresh_pass()
    resp = await http.get("/metrics")
    text = resp.text
    assert resp.status_code == 200, text[:500]
    values = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("orbit_deliveries{")
    }
    assert values['state="EXHAUSTED"'] >= 1 and values['state="PENDING"'] >= 1
    assert "orbit_deliveries_created_total" in text


async def test_openapi_lists_subscription_routes(
    server: LiveServer, http: httpx.AsyncClient
) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    base = "/v1/namespaces/{ns}"
    for path in ("subscriptions/{name}", "subscriptions/{name}/stream", "subscriptions/{name}/pull",
                 "subscriptions/{name}/deliveries", "deliveries/{id}/ack", "deliveries/{id}/nack",
                 "deliveries/{id}/budget"):  # fmt: skip
        assert f"{base}/{path}" in paths
    assert set(paths[f"{base}/subscriptions/{{name}}"]) >= {"put", "get"}
