"""The worker protocol end to end: a real uvicorn serving the Pulse routes with the
dispatcher and recovery loops, a real WebSocket client and HTTP fallback client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from platform_fixtures import add_key, bearer
from pulse_fixtures import Tenant

import pulse.http
from orbit.context import AppContext
from orbit.http.app import build_app
from pulse.runtime import PulseRuntime
from pulse.sessions import WorkerSettings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Live:
    """uvicorn + the Pulse background loops, in the test's event loop."""

    def __init__(self, db: Any) -> None:
        self.port = _free_port()
        self.ctx = AppContext(db=db, node_id=f"e2e-{self.port}")
        self.runtime = PulseRuntime.build(
            self.ctx, workers=WorkerSettings(dispatch_poll_ms=100, recovery_interval_ms=200)
        )
        self.app = build_app(self.ctx, pulse.http.routes(self.runtime))
        self.tasks: list[asyncio.Task[None]] = []
        self.server: uvicorn.Server | None = None
        self.stop_event = asyncio.Event()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def start(self) -> None:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
            ws_ping_interval=None,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.tasks.append(asyncio.create_task(self.server.serve()))
        for loop in self.runtime.loops():  # the server's lifespan contract
            self.tasks.append(asyncio.create_task(loop(self.stop_event)))
        for _ in range(300):
            if self.server.started:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("uvicorn did not start")

    async def stop(self) -> None:
        assert self.server is not None
        self.server.should_exit = True
        self.stop_event.set()  # the loops end by themselves
        for t in self.tasks:
            await asyncio.wait_for(t, 10)


@pytest.fixture
async def live(db) -> AsyncIterator[Live]:
    server = Live(db)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def client(live) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live.http, timeout=30) as c:
        yield c


class Worker:
    """A raw protocol client on one WebSocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0
        self.pending: list[dict[str, Any]] = []

    async def send(self, **frame: Any) -> str:
        self.n += 1
        msg_id = frame.pop("msg_id", None) or f"m{self.n}"
        await self.ws.send(json.dumps({**frame, "msg_id": msg_id}))
        return msg_id

    async def recv(self, type_: str | None = None, within: float = 10) -> dict[str, Any]:
        """Next frame (of ``type_``), keeping others for later."""
        for i, f in enumerate(self.pending):
            if type_ is None or f["type"] == type_:
                return self.pending.pop(i)
        loop = asyncio.get_running_loop()
        end = loop.time() + within
        while True:
            raw = await asyncio.wait_for(self.ws.recv(), max(0.01, end - loop.time()))
            frame = json.loads(raw)
            if type_ is None or frame["type"] == type_:
                return frame
            self.pending.append(frame)

    async def call(self, type_: str, reply: str | None = None, **fields: Any) -> dict[str, Any]:
        msg_id = await self.send(type=type_, **fields)
        while True:
            frame = await self.recv(reply)
            if frame.get("ref_msg_id") == msg_id:
                return frame
            self.pending.append(frame)


async def open_session(
    client: httpx.AsyncClient, t: Tenant, key: str | None = None, **body: Any
) -> httpx.Response:
    payload = {
        "instance": {"host": "e2e", "pid": 4242, "sdk": "raw/0"},
        "queues": [t.queue],
        "max_concurrency": 2,
        **body,
    }
    return await client.post(
        f"/v1/namespaces/{t.namespace}/workers/sessions", json=payload,
        headers=bearer(key or t.key),
    )  # fmt: skip


def stream_url(live: Live, t: Tenant, sid: str) -> str:
    return f"{live.ws}/v1/namespaces/{t.namespace}/workers/sessions/{sid}/stream"


async def submit(client: httpx.AsyncClient, t: Tenant, **body: Any) -> dict[str, Any]:
    body.setdefault("queue", t.queue)
    body.setdefault("kind", "k")
    body.setdefault("payload", {"x": 1})
    r = await client.post(f"/v1/namespaces/{t.namespace}/tasks", json=body, headers=t.auth)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def get_task(client: httpx.AsyncClient, t: Tenant, task_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/namespaces/{t.namespace}/tasks/{task_id}", headers=t.auth)
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


async def test_session_creation_rules(live, client, db, tenant) -> None:
    t = await tenant()
    r = await open_session(client, t)
    assert r.status_code == 201
    body = r.json()
    assert set(body) == {
        "session_id", "session_token", "instance_id", "heartbeat_ms", "lease_ms", "keyed_waiting"
    }  # fmt: skip
    assert len(body["session_id"]) == 32 and body["heartbeat_ms"] < body["lease_ms"]
    r = await open_session(client, t, queues=["missing"])
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    _, limited = await add_key(db, t, ["workers.connect"], queues=["elsewhere"])  # type: ignore[arg-type]
    r = await open_session(client, t, key=limited)
    assert r.status_code == 403
    _, no_action = await add_key(db, t, ["tasks.read"])  # type: ignore[arg-type]
    assert (await open_session(client, t, key=no_action)).status_code == 403
    assert (await open_session(client, t, key="orb_nope")).status_code == 401
    r = await open_session(client, t, max_concurrency=0)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "max_concurrency"
    # The same instance id registers again (a restarted worker process).
    iid = body["instance_id"]
    r = await open_session(client, t, instance={"id": iid, "host": "e2e", "pid": 2, "sdk": "raw/1"})
    assert r.status_code == 201 and r.json()["instance_id"] == iid


async def test_stream_rejects_wrong_token(live, client, tenant) -> None:
    t = await tenant()
    sid = (await open_session(client, t)).json()["session_id"]
    for token in ("nope", "pws_" + "0" * 32 + "_" + sid + "_" + "x" * 43):
        with pytest.raises(websockets.InvalidStatus) as err:
            async with websockets.connect(
                stream_url(live, t, sid), additional_headers=bearer(token)
            ):
                pass
        assert err.value.response.status_code == 401


async def test_full_protocol_over_websocket(live, client, tenant) -> None:
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=2)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        task = await submit(client, t, payload={"amount": 12.50, "nested": {"a": [1, 2.0]}})
        offer = await w.recv("offer")
        assert offer["task"]["id"] == task["id"] and offer["task"]["generation"] == 1
        assert offer["task"]["payload"] == {"amount": 12.5, "nested": {"a": [1, 2.0]}}
        aid = offer["attempt_id"]

        started = await w.call("start", attempt_id=aid)
        assert started["type"] == "started" and started["generation"] == 1
        assert started["concurrency_token"] is None
        token = started["execution_token"]

        hb = await w.call("heartbeat", attempt_ids=[aid])
        assert hb["type"] == "heartbeat_ok"
        assert hb["attempts"] == [
            {"attempt_id": aid, "ok": True, "lease_expires_at": hb["attempts"][0]["lease_expires_at"],
             "cancel_requested": False}
        ]  # fmt: skip

        eff = await w.call(
            "effect", attempt_id=aid, execution_token=token, key="mail", phase="begin"
        )
        assert eff["type"] == "effect_state" and eff["state"] == "new" and eff["key"] == "mail"
        eff = await w.call(
            "effect", attempt_id=aid, execution_token=token, key="mail", phase="commit",
            result={"id": "m-1"},
        )  # fmt: skip
        assert eff.get("state") == "committed", eff
        assert eff["result"] == {"id": "m-1"}

        bad = await w.call("complete", attempt_id=aid, execution_token="ext_wrong", result=1)
        assert bad["type"] == "error" and bad["code"] == "stale_token"

        # The result is kept byte for byte: send it as raw text.
        raw = f'{{"type":"complete","msg_id":"c1","attempt_id":"{aid}","execution_token":"{token}",' \
              '"result":{"total": 10.50, "ok": true}}'  # fmt: skip
        await ws.send(raw)
        receipt = await w.recv("receipt")
        assert receipt["ref_msg_id"] == "c1" and receipt["outcome"] == "applied"
        assert receipt["task_state"] == "SUCCEEDED"
        # Re-sent with a new msg_id: the original receipt, replayed.
        await ws.send(raw.replace('"msg_id":"c1"', '"msg_id":"c2"'))
        again = await w.recv("receipt")
        assert again["ref_msg_id"] == "c2" and again["outcome"] == "replayed"
        assert again["receipt_id"] == receipt["receipt_id"]

        r = await client.get(f"/v1/namespaces/{t.namespace}/tasks/{task['id']}", headers=t.auth)
        assert '"result":{"total": 10.50, "ok": true}' in r.text.replace(", ", ", ")
        assert r.json()["state"] == "SUCCEEDED"

        # Malformed frames get an error naming the message.
        await ws.send('{"type": "start", "msg_id": "bad1"}')
        err = await w.recv("error")
        assert err["code"] == "invalid_request" and err["ref_msg_id"] == "bad1"
        await ws.send("not json")
        err = await w.recv("error")
        assert err["code"] == "invalid_request" and err["ref_msg_id"] is None


async def test_cancel_running_task_over_websocket(live, client, tenant) -> None:
    t = await tenant()
    created = (await open_session(client, t)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        task = await submit(client, t)
        offer = await w.recv("offer")
        started = await w.call("start", attempt_id=offer["attempt_id"])
        r = await client.post(
            f"/v1/namespaces/{t.namespace}/tasks/{task['id']}/cancel", headers=t.auth
        )
        assert r.status_code == 202 and r.json()["cancel_requested"] is True
        cancel = await w.recv("cancel")
        assert cancel == {"type": "cancel", "attempt_id": offer["attempt_id"],
                          "reason": "cancel_requested"}  # fmt: skip
        hb = await w.call("heartbeat", attempt_ids=[offer["attempt_id"]])
        assert hb["attempts"][0]["cancel_requested"] is True
        receipt = await w.call(
            "cancelled", attempt_id=offer["attempt_id"],
            execution_token=started["execution_token"],
        )  # fmt: skip
        assert receipt["type"] == "receipt" and receipt["task_state"] == "CANCELLED"
    assert (await get_task(client, t, task["id"]))["state"] == "CANCELLED"


async def test_flow_control_and_disconnect_releases_offers(live, client, db, tenant) -> None:
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=2)).json()
    ids = [(await submit(client, t))["id"] for _ in range(5)]
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        first = [await w.recv("offer"), await w.recv("offer")]
        with pytest.raises(asyncio.TimeoutError):
            await w.recv("offer", within=0.6)  # never more than max_concurrency
        started = await w.call("start", attempt_id=first[0]["attempt_id"])
        await w.call(
            "complete", attempt_id=first[0]["attempt_id"],
            execution_token=started["execution_token"], result=None,
        )  # fmt: skip
        await w.recv("offer")  # one slot freed: one more offer
        with pytest.raises(asyncio.TimeoutError):
            await w.recv("offer", within=0.4)
    # The stream ended with 2 offers unstarted: they go back to WAITING at once.
    for _ in range(100):
        states = [(await get_task(client, t, i))["state"] for i in ids]
        if states.count("WAITING") == 4:
            break
        await asyncio.sleep(0.05)
    assert sorted(states) == ["SUCCEEDED", "WAITING", "WAITING", "WAITING", "WAITING"]


async def test_http_fallback(live, client, tenant) -> None:
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    sid, token = created["session_id"], created["session_token"]
    auth = bearer(token)
    base = f"/v1/namespaces/{t.namespace}"
    r = await client.post(f"{base}/workers/sessions/{sid}/poll?wait_ms=200", headers=auth)
    assert r.status_code == 200 and r.json() == {"offers": []}
    task = await submit(client, t, payload={"p": 1})
    r = await client.post(f"{base}/workers/sessions/{sid}/poll?wait_ms=5000", headers=auth)
    (offer,) = r.json()["offers"]
    assert offer["type"] == "offer" and offer["task"]["id"] == task["id"]
    aid = offer["attempt_id"]
    r = await client.post(f"{base}/attempts/{aid}/start", headers=auth)
    assert r.status_code == 200 and r.json()["type"] == "started"
    exec_token = r.json()["execution_token"]
    r = await client.post(f"{base}/attempts/{aid}/heartbeat", headers=auth)
    assert r.json()["attempts"][0]["ok"] is True
    r = await client.post(f"{base}/workers/sessions/{sid}/heartbeat", headers=auth,
                          json={"attempt_ids": [aid]})  # fmt: skip
    assert r.status_code == 200 and r.json()["type"] == "heartbeat_ok"
    r = await client.post(f"{base}/attempts/{aid}/complete", headers=auth,
                          json={"execution_token": "ext_bad", "result": 1})  # fmt: skip
    assert r.status_code == 409 and r.json()["error"]["code"] == "stale_token"
    body = {"execution_token": exec_token, "error": {"type": "Boom", "message": "no"},
            "retryable": False}  # fmt: skip
    r = await client.post(f"{base}/attempts/{aid}/fail", headers=auth, json=body)
    assert r.status_code == 200 and r.json()["outcome"] == "applied"
    assert r.json()["task_state"] == "FAILED"
    r2 = await client.post(f"{base}/attempts/{aid}/fail", headers=auth, json=body)
    assert r2.json()["outcome"] == "replayed" and r2.json()["receipt_id"] == r.json()["receipt_id"]
    # Wrong or missing session token: 401; unknown attempt: 404.
    assert (await client.post(f"{base}/attempts/{aid}/start")).status_code == 401
    r = await client.post(f"{base}/attempts/{'0' * 32}/start", headers=auth)
    assert r.status_code == 404
    r = await client.post(f"{base}/workers/sessions/{'0' * 32}/poll", headers=auth)
    assert r.status_code == 401


async def test_an_idle_submit_is_offered_by_the_submit_itself(live, client, tenant) -> None:
    """A session waits on the node with free slots and nothing else is due: the submit's own
    transaction leases the task to it (answer LEASED, revision 2) and the offer arrives."""
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=2)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:
        w = Worker(ws)
        # A frame answered over the stream: the server has registered it by now.
        assert (await w.call("heartbeat", attempt_ids=[]))["type"] == "heartbeat_ok"
        task = await submit(client, t)
        assert task["state"] == "LEASED" and task["revision"] == 2
        offer = await w.recv("offer")
        assert offer["task"]["id"] == task["id"]
        started = await w.call("start", attempt_id=offer["attempt_id"])
        assert started["type"] == "started"
        # Another submit while the first task runs: one free slot left, offered the same way.
        second = await submit(client, t)
        assert second["state"] == "LEASED"
        assert (await w.recv("offer"))["task"]["id"] == second["id"]
