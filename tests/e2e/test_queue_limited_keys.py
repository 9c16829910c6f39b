"""A key limited to queue ``qx`` reaches ``qx``'s tasks and nothing of ``qy``, on every way
there is: result events, subscriptions (create, read, pull, stream, delivery history, ack,
nack, budget), workflow instances whose steps run on ``qy``, and the namespace-wide gate."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import websockets
from platform_fixtures import (
    PTenant,
    add_key,
    asgi_client,
    bearer,
    make_app,
    new_tenant,
    pulse_weave_routes,
)
from subscription_fixtures import LiveServer

import orbit.http.subscriptions as sub_routes
from orbit.storage import Database

ACTIONS = [
    "events.read", "subscriptions.manage", "subscriptions.consume", "tasks.read",
    "tasks.submit", "tasks.cancel", "queues.manage", "workflows.manage", "workflows.signal",
]  # fmt: skip

WORKFLOW = {
    "input_schema": {"object": {}},
    "steps": [
        {"id": "work", "type": "task", "queue": "qy", "kind": "k", "payload": {}},
        {"id": "done", "type": "succeed"},
    ],
}


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, lambda ctx: [*sub_routes.routes(), *pulse_weave_routes(ctx)])
    async with asgi_client(app) as c:
        yield c


async def _tenant(client: httpx.AsyncClient, db: Database) -> tuple[PTenant, str, dict[str, str]]:
    t = await new_tenant(db)
    ns = f"/v1/namespaces/{t.namespace}"
    for q in ("qx", "qy"):
        assert (await client.put(f"{ns}/queues/{q}", json={}, headers=t.auth)).status_code == 201
    _, key = await add_key(db, t, ACTIONS, queues=["qx"])
    return t, ns, bearer(key)


async def _finished_task(client: httpx.AsyncClient, ns: str, t: PTenant, queue: str) -> str:
    """A task cancelled while waiting: one result event on ``queue``."""
    r = await client.post(f"{ns}/tasks", json={"queue": queue, "kind": "k", "payload": {}},
                          headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    r = await client.post(f"{ns}/tasks/{task_id}/cancel", headers=t.auth)
    assert r.status_code == 200, r.text
    return str(task_id)


async def test_events_show_only_the_keys_queues(client: httpx.AsyncClient, db: Database) -> None:
    t, ns, limited = await _tenant(client, db)
    x = await _finished_task(client, ns, t, "qx")
    ys = [await _finished_task(client, ns, t, "qy") for _ in range(3)]
    every = (await client.get(f"{ns}/events", headers=t.auth)).json()["items"]
    assert {e["task_id"] for e in every} == {x, *ys}
    r = await client.get(f"{ns}/events", headers=limited)
    assert r.status_code == 200
    assert [e["task_id"] for e in r.json()["items"]] == [x]
    # Paging with a small limit still skips the other queue's events.
    seen, cursor = [], None
    while True:
        params = {"limit": "1", **({"cursor": cursor} if cursor else {})}
        page = (await client.get(f"{ns}/events", params=params, headers=limited)).json()
        seen += [e["task_id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [x]


async def test_subscriptions_of_other_queues_are_out_of_reach(
    client: httpx.AsyncClient, db: Database
) -> None:
    t, ns, limited = await _tenant(client, db)
    subs = f"{ns}/subscriptions"
    for body in ({"filter": {"queues": ["qy"]}}, {"filter": {"queues": ["qx", "qy"]}}, {},
                 {"filter": {"kinds": ["k"]}}):  # fmt: skip
        r = await client.put(f"{subs}/mine", json={**body, "start": "earliest"}, headers=limited)
        assert r.status_code == 403, (body, r.text)
        assert r.json()["error"]["details"]["field"] == "filter.queues"
    r = await client.put(f"{subs}/mine", json={"filter": {"queues": ["qx"]}, "start": "earliest"},
                         headers=limited)  # fmt: skip
    assert r.status_code == 201, r.text
    # A subscription over every queue, made by the unlimited key, with a delivery in it.
    r = await client.put(f"{subs}/all", json={"start": "earliest"}, headers=t.auth)
    assert r.status_code == 201
    await _finished_task(client, ns, t, "qy")
    pulled = await client.post(f"{subs}/all/pull", json={"max": 1, "wait_ms": 5000},
                               headers=t.auth)  # fmt: skip
    (delivery,) = pulled.json()["deliveries"]
    did, proof = delivery["delivery_id"], delivery["proof"]
    for method, path, body in (
        ("GET", f"{subs}/all", None),
        ("GET", f"{subs}/all/deliveries", None),
        ("POST", f"{subs}/all/pull", {"max": 1}),
        ("PUT", f"{subs}/all", {"filter": {"queues": ["qx"]}}),
        ("POST", f"{ns}/deliveries/{did}/nack", {"proof": proof}),
        ("POST", f"{ns}/deliveries/{did}/ack", {"proof": proof}),
        ("POST", f"{ns}/deliveries/{did}/budget", {"add": 1}),
    ):
        r = await client.request(method, path, json=body, headers=limited)
        assert r.status_code == 404, (method, path, r.text)
    # The unlimited key still acks it: nothing was changed by the refused calls.
    r = await client.post(f"{ns}/deliveries/{did}/ack", json={"proof": proof}, headers=t.auth)
    assert r.status_code == 200, r.text
    assert (await client.get(f"{subs}/mine", headers=limited)).status_code == 200


async def test_stream_of_another_queues_subscription_is_refused(db: Database) -> None:
    server = await LiveServer(db).start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            t = await new_tenant(db)
            _, key = await add_key(db, t, ["subscriptions.manage", "subscriptions.consume"],
                                   queues=["qx"])  # fmt: skip
            r = await http.put(f"/v1/namespaces/{t.namespace}/subscriptions/all", json={},
                               headers=t.auth)  # fmt: skip
            assert r.status_code == 201
        url = f"{server.ws_base}/v1/namespaces/{t.namespace}/subscriptions/all/stream"
        with pytest.raises(websockets.InvalidStatus) as err:
            async with websockets.connect(url, additional_headers=bearer(key)):
                pass
        assert err.value.response.status_code == 404
    finally:
        await server.stop()


async def test_workflow_instances_on_other_queues_are_out_of_reach(
    client: httpx.AsyncClient, db: Database
) -> None:
    t, ns, limited = await _tenant(client, db)
    r = await client.post(f"{ns}/workflows/wy/versions", json={"definition": WORKFLOW},
                          headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    r = await client.post(f"{ns}/workflows/wy/instances", json={"input": {}}, headers=t.auth)
    assert r.status_code == 201, r.text
    iid = r.json()["id"]
    r = await client.post(f"{ns}/workflows/wy/instances", json={"input": {}}, headers=limited)
    assert r.status_code == 403  # starting it was refused already
    for method, path, body in (
        ("GET", f"{ns}/instances/{iid}", None),
        ("GET", f"{ns}/instances/{iid}/history", None),
        ("POST", f"{ns}/instances/{iid}/signals/go", {"signal_id": "s1", "payload": {}}),
        ("POST", f"{ns}/instances/{iid}/pause", None),
        ("POST", f"{ns}/instances/{iid}/resume", None),
        ("POST", f"{ns}/instances/{iid}/cancel", {}),
    ):
        r = await client.request(method, path, json=body, headers=limited)
        assert r.status_code == 404, (method, path, r.text)
    listed = await client.get(f"{ns}/instances", headers=limited)
    assert listed.status_code == 200 and listed.json()["items"] == []
    every = await client.get(f"{ns}/instances", headers=t.auth)
    assert [i["id"] for i in every.json()["items"]] == [iid]
    got = await client.get(f"{ns}/instances/{iid}", headers=t.auth)
    assert got.json()["state"] == "RUNNING" and got.json()["paused"] is False


async def test_namespace_gate_needs_a_key_for_every_queue(
    client: httpx.AsyncClient, db: Database
) -> None:
    t, ns, limited = await _tenant(client, db)
    for action in ("pause", "resume"):
        r = await client.post(f"{ns}/{action}", headers=limited)
        assert r.status_code == 403, r.text
    assert (await client.get(f"{ns}/gate", headers=t.auth)).json()["paused"] is False
    assert (await client.post(f"{ns}/queues/qx/pause", headers=limited)).status_code == 200
    assert (await client.post(f"{ns}/queues/qy/pause", headers=limited)).status_code == 403
