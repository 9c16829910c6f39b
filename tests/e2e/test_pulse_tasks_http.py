"""Producer/operator HTTP routes end to end (httpx over ASGI, real database): status codes,
headers (ETag, Retry-After, Idempotent-Replayed), error bodies, authorization, hub calls."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from platform_fixtures import add_key, bearer, make_app
from pulse_fixtures import Tenant, force_state

import pulse.http
from orbit.ids import id_hex
from pulse.hub import Hub
from pulse.runtime import PulseRuntime


class RecordingHub(Hub):
    """The node's hub, recording the calls Pulse makes after commit."""

    def __init__(self) -> None:
        super().__init__("test-node")
        self.cancels: list[tuple[bytes, bytes, bytes]] = []
        self.work: list[tuple[bytes | None, bytes | None]] = []

    async def request_cancel(self, namespace_id: bytes, task_id: bytes, attempt_id: bytes) -> bool:
        self.cancels.append((namespace_id, task_id, attempt_id))
        return await super().request_cancel(namespace_id, task_id, attempt_id)

    def notify_new_work(
        self, namespace_id: bytes | None = None, queue_id: bytes | None = None
    ) -> None:
        self.work.append((namespace_id, queue_id))
        super().notify_new_work(namespace_id, queue_id)


@pytest.fixture
async def http(db) -> Any:
    hub = RecordingHub()
    app = make_app(db, lambda ctx: pulse.http.routes(PulseRuntime.build(ctx, hub=hub)))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://orbit.test"
    ) as client:
        client.hub = hub  # type: ignore[attr-defined]
        yield client


def base(t: Tenant) -> str:
    return f"/v1/namespaces/{t.namespace}"


async def test_queue_put_get_etag(http, tenant) -> None:
    t = await tenant()
    url = f"{base(t)}/queues/mail"
    r = await http.put(url, json={"max_concurrency": 2}, headers={**t.auth, "If-None-Match": "*"})
    assert r.status_code == 201 and r.headers["ETag"] == '"1"'
    assert r.json()["max_concurrency"] == 2
    r = await http.put(url, json={}, headers={**t.auth, "If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["error"]["code"] == "precondition_failed"
    r = await http.put(url, json={"max_concurrency": 3}, headers={**t.auth, "If-Match": '"9"'})
    assert r.status_code == 412
    r = await http.put(url, json={"max_concurrency": 3}, headers={**t.auth, "If-Match": '"1"'})
    assert r.status_code == 200 and r.headers["ETag"] == '"2"'
    r = await http.put(url, json={"max_concurrency": 3}, headers=t.auth)
    assert r.status_code == 200 and r.headers["ETag"] == '"2"'  # no-op keeps the revision
    r = await http.put(url, json={"lease_ms": 10}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "lease_ms"
    r = await http.put(url, json={"retry": {"max_attempts": 0}}, headers=t.auth)
    assert r.json()["error"]["details"]["field"] == "retry.max_attempts"
    r = await http.put(f"{base(t)}/queues/bad name", json={}, headers=t.auth)
    assert r.status_code == 400
    r = await http.get(url, headers=t.auth)
    assert r.status_code == 200 and r.headers["ETag"] == '"2"'
    assert r.json()["counts"]["WAITING"] == 0 and r.json()["usage"]["unfinished_tasks"] == 0
    r = await http.get(f"{base(t)}/queues/none", headers=t.auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await http.get(f"{base(t)}/queues?limit=1", headers=t.auth)
    assert len(r.json()["items"]) == 1 and r.json()["next_cursor"]
    r = await http.post(f"{url}/pause", headers=t.auth)
    assert r.status_code == 200 and r.json()["paused"] is True
    r = await http.post(f"{url}/pause", headers=t.auth)
    assert r.json()["gate"]["control_revision"] == 1
    r = await http.post(f"{base(t)}/pause", headers=t.auth)
    assert r.status_code == 200 and r.json()["paused"] is True
    r = await http.get(f"{base(t)}/gate", headers=t.auth)
    assert r.json()["paused"] is True
    r = await http.post(f"{base(t)}/resume", headers=t.auth)
    assert r.json()["paused"] is False and r.json()["control_revision"] == 2


async def test_submit_dedup_idempotency_and_errors(http, tenant) -> None:
    t = await tenant()
    url = f"{base(t)}/tasks"
    body = b'{"queue": "default", "kind": "send", "dedup_key": "u-1", "payload": {"n": 1.50}}'
    headers = {**t.auth, "Content-Type": "application/json"}
    r = await http.post(url, content=body, headers=headers)
    assert r.status_code == 201
    assert b'"payload":{"n": 1.50}' in r.content  # byte-exact
    task = r.json()
    assert task["owner_id"] == t.owner_hex and task["state"] == "WAITING"
    assert http.hub.work == [(t.namespace_id, t.queue_id)]
    r = await http.post(url, content=body, headers=headers)
    assert r.status_code == 200 and r.json()["deduplicated"] is True
    assert r.json()["id"] == task["id"]
    assert len(http.hub.work) == 1  # nothing new to dispatch

    idem = {**headers, "Idempotency-Key": "abc"}
    other = b'{"queue": "default", "kind": "x"}'
    r1 = await http.post(url, content=other, headers=idem)
    r2 = await http.post(url, content=other, headers=idem)
    assert r1.status_code == r2.status_code == 201
    assert r2.headers.get("Idempotent-Replayed") == "true" and r1.content == r2.content
    r3 = await http.post(url, content=b'{"queue": "default", "kind": "y"}', headers=idem)
    assert r3.status_code == 422

    r = await http.post(url, json={"queue": "nope", "kind": "k"}, headers=t.auth)
    assert r.status_code == 404
    r = await http.post(url, json={"queue": "default", "kind": "k", "priority": 11}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "priority"
    r = await http.post(url, json={"queue": "default"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "kind"
    r = await http.post(url, json={"queue": "default", "kind": "k"})
    assert r.status_code == 401


async def test_quota_429_retry_after(http, tenant) -> None:
    t = await tenant(max_unfinished_tasks=1)
    url = f"{base(t)}/tasks"
    assert (
        await http.post(url, json={"queue": "default", "kind": "k"}, headers=t.auth)
    ).status_code == 201
    r = await http.post(url, json={"queue": "default", "kind": "k"}, headers=t.auth)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["code"] == "quota_exceeded"
    listed = (await http.get(url, headers=t.auth)).json()["items"]
    assert len(listed) == 1


async def test_batch_http(http, tenant) -> None:
    t = await tenant()
    r = await http.post(
        f"{base(t)}/tasks:batch",
        json={
            "tasks": [{"queue": "default", "kind": "a"}, {"queue": "x", "kind": "b"}, {"kind": 1}]
        },
        headers=t.auth,
    )
    assert r.status_code == 200
    assert [i["status"] for i in r.json()["items"]] == [201, 404, 400]
    r = await http.post(f"{base(t)}/tasks:batch", json={"tasks": [{}] * 1001}, headers=t.auth)
    assert r.status_code == 400


async def test_read_list_attempts_and_isolation(http, tenant) -> None:
    t = await tenant()
    other = await tenant()
    mine = await t.submit(kind="a")
    theirs = await other.submit(kind="a")
    r = await http.get(f"{base(t)}/tasks/{mine['id']}", headers=t.auth)
    assert r.status_code == 200 and r.json()["id"] == mine["id"]
    r404 = await http.get(f"{base(t)}/tasks/{theirs['id']}", headers=t.auth)
    r404b = await http.get(f"{base(t)}/tasks/{'0' * 32}", headers=t.auth)
    assert r404.status_code == r404b.status_code == 404 and r404.content == r404b.content
    assert (await http.get(f"{base(other)}/tasks/{mine['id']}", headers=t.auth)).status_code == 404
    r = await http.get(f"{base(t)}/tasks?kind=a&limit=1", headers=t.auth)
    assert [x["id"] for x in r.json()["items"]] == [mine["id"]]
    await t.submit(kind="a")
    r = await http.get(f"{base(t)}/tasks?kind=a&limit=1", headers=t.auth)
    cursor = r.json()["next_cursor"]
    assert cursor
    r = await http.get(f"{base(t)}/tasks?kind=b&limit=1&cursor={cursor}", headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "cursor"
    r = await http.get(f"{base(t)}/tasks?state=NOPE", headers=t.auth)
    assert r.status_code == 400
    await force_state(t.db, t, mine["id"], "RUNNING")
    r = await http.get(f"{base(t)}/tasks/{mine['id']}/attempts", headers=t.auth)
    assert r.status_code == 200
    assert [a["generation"] for a in r.json()["items"]] == [1]
    assert r.json()["items"][0]["state"] == "RUNNING"
    r = await http.get(f"{base(t)}/tasks/{theirs['id']}/attempts", headers=t.auth)
    assert r.status_code == 404


async def test_cancel_http_and_hub(http, tenant) -> None:
    t = await tenant()
    waiting = await t.submit()
    running = await t.submit()
    done = await force_state(t.db, t, running["id"], "RUNNING")
    r = await http.post(f"{base(t)}/tasks/{waiting['id']}/cancel", headers=t.auth)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    r = await http.post(f"{base(t)}/tasks/{waiting['id']}/cancel", headers=t.auth)
    assert r.status_code == 200
    r = await http.post(f"{base(t)}/tasks/{running['id']}/cancel", headers=t.auth)
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    assert http.hub.cancels == [
        (t.namespace_id, bytes.fromhex(running["id"]), bytes.fromhex(done["attempt_id"]))
    ]
    review = await t.submit()
    await force_state(t.db, t, review["id"], "NEEDS_REVIEW")
    r = await http.post(f"{base(t)}/tasks/{review['id']}/cancel", headers=t.auth)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    for _ in range(3):
        await t.submit(kind="bulk")
    r = await http.post(
        f"{base(t)}/tasks:cancel", json={"owner_id": t.owner_hex, "kind": "bulk"}, headers=t.auth
    )
    assert r.status_code == 200 and r.json() == {"cancelled": 3, "cancel_requested": 0}


async def test_resolve_http(http, tenant) -> None:
    t = await tenant()
    task = await t.submit()
    r = await http.post(
        f"{base(t)}/tasks/{task['id']}/resolve",
        json={"action": "retry", "note": "n"},
        headers=t.auth,
    )
    assert r.status_code == 409
    await force_state(t.db, t, task["id"], "NEEDS_REVIEW")
    r = await http.post(
        f"{base(t)}/tasks/{task['id']}/resolve", json={"action": "succeed"}, headers=t.auth
    )
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "note"
    r = await http.post(
        f"{base(t)}/tasks/{task['id']}/resolve",
        content=b'{"action": "succeed", "note": "checked by hand", "result": {"ok": 1e3}}',
        headers={**t.auth, "Content-Type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["state"] == "SUCCEEDED"
    assert b'"result":{"ok": 1e3}' in r.content
    ev = await http.get(f"{base(t)}/events?after_seq=0", headers=t.auth)
    types = [e["type"] for e in ev.json()["items"]]
    assert types == ["task.needs_review", "task.succeeded"]
    assert ev.json()["items"][1]["result"] == {"ok": 1000.0}


async def test_authorization(http, db, tenant) -> None:
    t = await tenant()
    task = await t.submit()
    from platform_fixtures import PTenant

    pt = PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )
    _, reader = await add_key(db, pt, ["tasks.read"])
    h = bearer(reader)
    assert (await http.get(f"{base(t)}/tasks/{task['id']}", headers=h)).status_code == 200
    assert (
        await http.post(f"{base(t)}/tasks", json={"queue": "default", "kind": "k"}, headers=h)
    ).status_code == 403
    assert (await http.post(f"{base(t)}/tasks/{task['id']}/cancel", headers=h)).status_code == 403
    assert (await http.put(f"{base(t)}/queues/x", json={}, headers=h)).status_code == 403
    # a key limited to queue "default"
    await t.add_queue("secret")
    hidden = await t.submit(queue="secret")
    _, limited = await add_key(
        db, pt, ["tasks.read", "tasks.submit", "tasks.cancel"], queues=["default"]
    )
    h = bearer(limited)
    assert (await http.get(f"{base(t)}/tasks/{hidden['id']}", headers=h)).status_code == 404
    assert (await http.get(f"{base(t)}/tasks/{task['id']}", headers=h)).status_code == 200
    r = await http.post(f"{base(t)}/tasks", json={"queue": "secret", "kind": "k"}, headers=h)
    assert r.status_code == 403
    r = await http.post(
        f"{base(t)}/tasks:batch",
        json={"tasks": [{"queue": "secret", "kind": "k"}, {"queue": "default", "kind": "k"}]},
        headers=h,
    )
    assert [i["status"] for i in r.json()["items"]] == [404, 201]
    assert (await http.get(f"{base(t)}/tasks", headers=h)).status_code == 403
    assert (await http.get(f"{base(t)}/tasks?queue=default", headers=h)).status_code == 200
    assert id_hex(t.namespace_id)
