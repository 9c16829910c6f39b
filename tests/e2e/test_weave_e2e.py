"""Weave over HTTP, end to end.

* The instance routes through the real Starlette app (httpx ASGITransport + MariaDB): start
  (business key, Idempotency-Key), read with ETag, history, signals (201 / 200 duplicate /
  409 reuse), pause/resume/cancel with If-Match, actions, 404s, validation errors.
* The order fulfilment example (docs/examples/order_fulfilment/) against a real uvicorn
  server running the platform, Pulse and Weave routes with the dispatcher, recovery,
  advancer and timer loops; its tasks run in an SDK ``Worker`` over WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn
from orbit_sdk import TaskContext, Worker
from platform_fixtures import (
    PTenant,
    add_key,
    asgi_client,
    bearer,
    make_app,
    new_tenant,
    pulse_weave_routes,
)

import pulse.http
import weave.http
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.http.app import build_app
from orbit.storage import Database
from pulse.runtime import PulseRuntime
from pulse.sessions import WorkerSettings
from weave.advancer import AdvancerSettings
from weave.runtime import WeaveRuntime
from weave.timers import TimerSettings

EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "docs" / "examples" / "order_fulfilment" / "order_fulfilment.py"
)  # fmt: skip

DOC = {
    "input_schema": {"object": {"order": "string"}},
    "steps": [
        {"id": "pay", "type": "task", "queue": "q", "kind": "pay",
         "payload": {"order": {"$": "$.input.order"}}},
        {"id": "ship", "type": "wait_signal", "signal": "shipped",
         "correlation_key": "$.input.order"},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.ship.output"}},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, pulse_weave_routes)
    async with asgi_client(app) as c:
        yield c


async def setup(client: httpx.AsyncClient, t: PTenant) -> str:
    """A queue ``q`` and the workflow; returns the namespace path prefix."""
    ns = f"/v1/namespaces/{t.namespace}"
    r = await client.put(f"{ns}/queues/q", json={}, headers=t.auth)
    assert r.status_code in (200, 201), r.text
    r = await client.post(f"{ns}/workflows/orders/versions", json={"definition": DOC},
                          headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    return ns


async def test_instance_lifecycle_over_http(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    ns = await setup(client, t)
    start = f"{ns}/workflows/orders/instances"
    r = await client.post(start, content=b'{"input": {"order": "o-1", "n": 1.50}}',
                          headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    inst = r.json()
    iid = inst["id"]
    assert inst["state"] == "RUNNING" and inst["paused"] is False and inst["version"] == 1
    assert inst["owner_id"] == t.app_hex and inst["workflow"] == "orders"
    assert [s["step"] for s in inst["steps"]] == ["pay"]
    assert b'"n": 1.50' in r.content  # the input is returned byte for byte

    got = await client.get(f"{ns}/instances/{iid}", headers=t.auth)
    assert got.status_code == 200 and got.headers["etag"] == '"1"'

    # Idempotent start: business key, and Idempotency-Key replays.
    body = {"input": {"order": "o-2"}, "business_key": "o-2"}
    first = await client.post(start, json=body, headers=t.auth)
    second = await client.post(start, json=body, headers=t.auth)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"] and second.json()["deduplicated"] is True
    h = {**t.auth, "Idempotency-Key": "start-3"}
    a = await client.post(start, json={"input": {"order": "o-3"}}, headers=h)
    b = await client.post(start, json={"input": {"order": "o-3"}}, headers=h)
    assert a.status_code == 201 and b.headers["idempotent-replayed"] == "true"
    assert b.json()["id"] == a.json()["id"]

    # Signals: created, duplicate replay, conflicting reuse.
    sig = f"{ns}/instances/{iid}/signals/shipped"
    s_body = {"signal_id": "wh-1", "correlation_key": "o-1", "payload": {"tracking": "T1"}}
    s1 = await client.post(sig, json=s_body, headers=t.auth)
    s2 = await client.post(sig, json=s_body, headers=t.auth)
    assert (s1.status_code, s2.status_code) == (201, 200) and s1.content == s2.content
    s3 = await client.post(sig, json={**s_body, "payload": {"tracking": "T2"}}, headers=t.auth)
    assert s3.status_code == 409 and s3.json()["error"]["code"] == "conflict"

    # Pause / resume / cancel with If-Match on the control revision.
    p = await client.post(f"{ns}/instances/{iid}/pause", headers={**t.auth, "If-Match": '"9"'})
    assert p.status_code == 412
    p = await client.post(f"{ns}/instances/{iid}/pause", headers={**t.auth, "If-Match": '"1"'})
    assert p.status_code == 200 and p.json()["paused"] is True and p.headers["etag"] == '"2"'
    r = await client.post(f"{ns}/instances/{iid}/resume", headers=t.auth)
    assert r.status_code == 200 and r.json()["paused"] is False
    c = await client.post(f"{ns}/instances/{iid}/cancel", json={"reason": "test over"},
                          headers=t.auth)  # fmt: skip
    assert c.status_code == 200 and c.json()["state"] == "CANCELLED"
    assert c.json()["error"] == {"code": "cancelled", "message": "test over"}
    again = await client.post(f"{ns}/instances/{iid}/cancel", headers=t.auth)
    assert again.status_code == 200
    late = await client.post(sig, json={**s_body, "signal_id": "wh-2"}, headers=t.auth)
    assert late.status_code == 409
    p = await client.post(f"{ns}/instances/{iid}/pause", headers=t.auth)
    assert p.status_code == 409 and p.json()["error"]["details"]["state"] == "CANCELLED"

    hist = await client.get(f"{ns}/instances/{iid}/history", headers=t.auth)
    assert hist.status_code == 200
    h_body = hist.json()
    assert [e["entry"] for e in h_body["items"]] == ["step", "activation"]
    assert [s["signal_id"] for s in h_body["signals"]] == ["wh-1"]
    page = await client.get(f"{ns}/instances/{iid}/history?limit=1", headers=t.auth)
    nxt = page.json()["next_cursor"]
    rest = await client.get(f"{ns}/instances/{iid}/history?cursor={nxt}", headers=t.auth)
    assert [e["entry"] for e in rest.json()["items"]] == ["activation"]

    listed = await client.get(f"{ns}/instances?workflow=orders&state=CANCELLED", headers=t.auth)
    assert [i["id"] for i in listed.json()["items"]] == [iid]
    page = await client.get(f"{ns}/instances?limit=2", headers=t.auth)
    assert len(page.json()["items"]) == 2 and page.json()["next_cursor"]
    more = await client.get(f"{ns}/instances?limit=2&cursor={page.json()['next_cursor']}",
                            headers=t.auth)  # fmt: skip
    assert len(more.json()["items"]) == 1


async def test_actions_and_namespaces(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    ns = await setup(client, t)
    r = await client.post(f"{ns}/workflows/orders/instances", json={"input": {"order": "x"}},
                          headers=t.auth)  # fmt: skip
    iid = r.json()["id"]
    _, reader = await add_key(db, t, ["tasks.read"])
    _, signaller = await add_key(db, t, ["workflows.signal"])
    assert (await client.get(f"{ns}/instances/{iid}", headers=bearer(reader))).status_code == 200
    assert (await client.get(f"{ns}/instances/{iid}/history",
                             headers=bearer(reader))).status_code == 200  # fmt: skip
    denied = await client.post(f"{ns}/workflows/orders/instances",
                               json={"input": {"order": "y"}}, headers=bearer(reader))  # fmt: skip
    assert denied.status_code == 403
    assert (await client.post(f"{ns}/instances/{iid}/cancel",
                              headers=bearer(reader))).status_code == 403  # fmt: skip
    sig = {"signal_id": "s", "correlation_key": "x", "payload": 1}
    assert (await client.post(f"{ns}/instances/{iid}/signals/shipped", json=sig,
                              headers=bearer(signaller))).status_code == 201  # fmt: skip
    assert (await client.post(f"{ns}/instances/{iid}/signals/shipped", json=sig,
                              headers=bearer(reader))).status_code == 403  # fmt: skip
    assert (await client.get(f"{ns}/instances/{iid}", headers=bearer(signaller))).status_code == 403
    # A key limited to other queues may not start a workflow whose tasks use queue "q".
    _, narrow = await add_key(db, t, ["workflows.manage"], queues=["elsewhere"])
    r = await client.post(f"{ns}/workflows/orders/instances", json={"input": {"order": "z"}},
                          headers=bearer(narrow))  # fmt: skip
    assert r.status_code == 403 and r.json()["error"]["details"]["queues"] == ["q"]
    _, wide = await add_key(db, t, ["workflows.manage"], queues=["q"])
    r = await client.post(f"{ns}/workflows/orders/instances", json={"input": {"order": "z"}},
                          headers=bearer(wide))  # fmt: skip
    assert r.status_code == 201
    # Another tenant sees nothing: the same 404 as an absent instance.
    other = await new_tenant(db)
    ons = f"/v1/namespaces/{other.namespace}"
    for path in (f"{ons}/instances/{iid}", f"{ons}/instances/{'0' * 32}", f"{ons}/instances/zz"):
        r = await client.get(path, headers=other.auth)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.post(f"{ons}/instances/{iid}/signals/shipped", json=sig, headers=other.auth)
    assert r.status_code == 404
    assert (await client.get(f"{ns}/instances/{iid}")).status_code == 401


async def test_bad_requests(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    ns = await setup(client, t)
    start = f"{ns}/workflows/orders/instances"
    r = await client.post(start, json={"input": {"order": 5}}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "input"
    r = await client.post(start, json={"input": {}, "bogus": 1}, headers=t.auth)
    assert r.status_code == 400
    r = await client.post(f"{ns}/workflows/nope/instances", json={"input": {}}, headers=t.auth)
    assert r.status_code == 404
    r = await client.post(start, json={"input": {"order": "a"}, "version": 9}, headers=t.auth)
    assert r.status_code == 404
    iid = (await client.post(start, json={"input": {"order": "a"}}, headers=t.auth)).json()["id"]
    bad = await client.post(f"{ns}/instances/{iid}/signals/bad name!", json={"signal_id": "s"},
                            headers=t.auth)  # fmt: skip
    assert bad.status_code == 400
    bad = await client.post(f"{ns}/instances/{iid}/signals/ok", json={"payload": 1},
                            headers=t.auth)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "signal_id"
    r = await client.get(f"{ns}/instances?state=NOPE", headers=t.auth)
    assert r.status_code == 400


async def test_openapi_documents_the_instance_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path in ("/v1/namespaces/{ns}/workflows/{name}/instances",
                 "/v1/namespaces/{ns}/instances/{id}/history",
                 "/v1/namespaces/{ns}/instances/{id}/signals/{signal}",
                 "/v1/namespaces/{ns}/instances/{id}/cancel"):  # fmt: skip
        assert path in spec["paths"], path


# ----------------------------------------------------------------------------- a real server


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("order_fulfilment_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the test owns the signals
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def server(db: Database) -> AsyncIterator[tuple[str, Any]]:
    """uvicorn serving the platform, Pulse and Weave, with every Pulse and Weave loop."""
    port = _free_port()
    ctx = AppContext(db=db, node_id=f"weave-e2e-{port}")
    prt = PulseRuntime.build(
        ctx, workers=WorkerSettings(dispatch_poll_ms=50, recovery_interval_ms=200)
    )
    wrt = WeaveRuntime.build(
        ctx, prt, advancer=AdvancerSettings(poll_s=0.05), timers=TimerSettings(poll_s=0.05)
    )
    app = build_app(ctx, [*pulse.http.routes(prt), *weave.http.routes(wrt)])
    uv = _Uvicorn(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                 lifespan="off"))  # fmt: skip
    stop = asyncio.Event()
    tasks = [asyncio.create_task(uv.serve())]
    tasks += [asyncio.create_task(loop(stop)) for loop in [*prt.loops(), *wrt.loops()]]
    try:
        async with asyncio.timeout(10):
            while not uv.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}", ctx
    finally:
        stop.set()
        uv.should_exit = True
        for t in tasks[1:]:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(t, 10)


async def test_order_fulfilment_example_runs_end_to_end(
    server: tuple[str, Any], db: Database
) -> None:
    url, _ctx = server
    boot = await bootstrap(db, f"shop-{secrets.token_hex(4)}", "shop")
    example = _load_example()
    summary = await example.run_demo(url, boot.key, boot.namespace, ship_timeout_ms=1500,
                                     within_s=60)  # fmt: skip
    inst = summary["instances"]
    happy, lost, declined = inst["happy"], inst["lost"], inst["declined"]

    assert happy["state"] == "SUCCEEDED", happy
    assert happy["output"]["tracking"].startswith("TRK-o-")
    assert happy["output"]["charge_id"] == "ch-" + happy["output"]["order"]
    assert set(happy["steps"]) == {"reserve", "charge", "paid", "ship", "notify", "email",
                                   "receipt", "notify_join", "done"}  # fmt: skip
    assert summary["signal_statuses"] == [201, 200]  # the resent signal was a replay

    assert lost["state"] == "FAILED" and lost["error"]["code"] == "order_cancelled"
    assert lost["steps"]["ship"] == "TIMED_OUT"
    assert lost["steps"]["refund"] == lost["steps"]["release"] == "SUCCEEDED"

    assert declined["state"] == "FAILED" and declined["error"]["code"] == "order_cancelled"
    assert declined["steps"]["charge"] == "FAILED" and "refund" not in declined["steps"]
    assert declined["steps"]["release"] == "SUCCEEDED"

    orders = summary["orders"]
    done = summary["services"]
    assert [c for k, c in done if k == "refund"] == [f"ch-{orders['lost']}"]  # compensation
    assert sorted(r for k, r in done if k == "release") == sorted(
        [f"res-{orders['lost']}", f"res-{orders['declined']}"]
    )
    assert sorted(o for k, o in done if k == "charge") == sorted([orders["happy"], orders["lost"]])

    # The history of the happy order: every task ran once, in order.
    async with httpx.AsyncClient(base_url=url, headers=bearer(boot.key)) as http:
        h = await http.get(f"/v1/namespaces/{boot.namespace}/instances/{happy['id']}/history")
    body = h.json()
    acts = [e for e in body["items"] if e["entry"] == "activation"]
    assert [a["step"] for a in acts][:3] == ["reserve", "charge", "ship"]
    assert all(a["state"] == "SUCCEEDED" for a in acts)
    assert [s["signal_id"] for s in body["signals"]] == [f"ship-{happy['output']['order']}"]


async def test_sleep_and_poll_with_a_real_worker(server: tuple[str, Any], db: Database) -> None:
    """A durable sleep fired by the server's timer loop, then a poll whose rounds run in an
    SDK worker over WebSocket, with a poll_interval timer between rounds."""
    url, _ctx = server
    boot = await bootstrap(db, f"poll-{secrets.token_hex(4)}", "poll")
    ns = f"/v1/namespaces/{boot.namespace}"
    doc = {
        "steps": [
            {"id": "nap", "type": "sleep", "duration_ms": 300},
            {"id": "track", "type": "poll", "max_rounds": 5, "interval_ms": 100,
             "until": {"op": "==", "args": ["$.result.state", "delivered"]},
             "task": {"queue": "tracking", "kind": "status", "payload": {"n": 1},
                      "output_schema": {"object": {"state": "string"}}}},
            {"id": "done", "type": "succeed", "output": {"$": "$.steps.track.output"}},
        ]
    }  # fmt: skip
    calls: list[int] = []
    worker = Worker(url, boot.key, namespace=boot.namespace)

    @worker.task("tracking", "status")
    async def status(ctx: TaskContext, payload: Any) -> Any:
        calls.append(1)
        return {"state": "delivered" if len(calls) >= 3 else "in_transit", "round": len(calls)}

    async with httpx.AsyncClient(base_url=url, headers=bearer(boot.key), timeout=30) as http:
        assert (await http.put(f"{ns}/queues/tracking", json={})).status_code == 201
        r = await http.post(f"{ns}/workflows/track/versions", json={"definition": doc})
        assert r.status_code == 201, r.text
        inst = (await http.post(f"{ns}/workflows/track/instances", json={})).json()
        runner = asyncio.create_task(worker.run(install_signal_handlers=False))
        try:
            async with asyncio.timeout(30):
                while True:
                    got = (await http.get(f"{ns}/instances/{inst['id']}")).json()
                    if got["state"] != "RUNNING":
                        break
                    await asyncio.sleep(0.05)
        finally:
            worker.drain()
            await asyncio.wait_for(runner, 30)
        hist = (await http.get(f"{ns}/instances/{inst['id']}/history")).json()
    assert got["state"] == "SUCCEEDED", got
    assert got["output"] == {"state": "delivered", "round": 3}
    waits = [(e["kind"], e["state"]) for e in hist["items"] if e["entry"] == "wait"]
    assert waits == [("sleep", "FIRED"), ("poll_interval", "FIRED"), ("poll_interval", "FIRED")]
    rounds = [e["condition_met"] for e in hist["items"] if e.get("kind") == "poll_round"]
    assert rounds == [False, False, True]
