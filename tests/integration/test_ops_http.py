"""Operator routes end to end (httpx over ASGI, real database): deletes of queues (409 naming
what holds them), subscriptions and workflows (409 while instances run); the workers view
and an operator's close of a session (recovery rules for its attempts); the audit list with
its filters. Each with the action it needs and tenant isolation (another tenant's key gets
the same 404 as an absent resource)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from platform_fixtures import (
    PTenant,
    add_key,
    asgi_client,
    bearer,
    make_app,
    pulse_weave_routes,
    raw_query,
)
from pulse_fixtures import Tenant
from pulse_worker_support import connect, open_session, task_row

from orbit.http import audit as audit_routes
from orbit.http import subscription_delete
from orbit.http import subscriptions as subscription_routes
from orbit.ids import id_hex, parse_id
from orbit.storage import DSN, Database
from pulse import attempts, submit, wire
from pulse import schedules as schedule_service
from pulse.dispatch import Dispatcher
from pulse.errors import QueueNotFound
from pulse.hub import Hub
from pulse.queue_delete import QueueInUse, delete_queue
from pulse.types import TaskSubmit


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, lambda ctx: [
        *subscription_routes.routes(), *subscription_delete.routes(), *audit_routes.routes(),
        *pulse_weave_routes(ctx),
    ])  # fmt: skip
    async with asgi_client(app) as c:
        yield c


def ptenant(t: Tenant) -> PTenant:
    return PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )


def ns(t: Tenant) -> str:
    return f"/v1/namespaces/{t.namespace}"


async def same_404(client: httpx.AsyncClient, method: str, path: str, other: Tenant) -> None:
    """``other``'s key on ``path`` gets the 404 an absent resource of its own gets."""
    theirs = await client.request(method, path, headers=other.auth)
    assert theirs.status_code == 404, theirs.text
    assert theirs.json()["error"]["code"] == "not_found"


# ---------------------------------------------------------------------------- queues


async def test_delete_an_unused_queue(
    client: httpx.AsyncClient, tenant: Any, db: Database, dsn: DSN
) -> None:
    t = await tenant()
    await t.add_queue("spare")
    url = f"{ns(t)}/queues/spare"
    r = await client.delete(url, headers={**t.auth, "If-Match": '"9"'})
    assert r.status_code == 412
    other = await tenant()
    await same_404(client, "DELETE", url, other)
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    assert (await client.delete(url, headers=bearer(reader))).status_code == 403
    _, limited = await add_key(db, ptenant(t), ["queues.manage"], queues=["default"])
    assert (await client.delete(url, headers=bearer(limited))).status_code == 403
    r = await client.delete(url, headers=t.auth)
    assert r.status_code == 204 and r.content == b""
    assert (await client.get(url, headers=t.auth)).status_code == 404
    assert (await client.delete(url, headers=t.auth)).status_code == 404
    sub = await client.post(f"{ns(t)}/tasks", json={"queue": "spare", "kind": "k"}, headers=t.auth)
    assert sub.status_code == 404
    again = await client.put(url, json={}, headers=t.auth)
    assert again.status_code == 201 and again.json()["revision"] == 1
    audited = raw_query(
        dsn,
        "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action = 'queues.delete' AND outcome = 'ok'",
        (t.namespace_id,),
    )
    assert audited == [(1,)]


async def test_a_queue_in_use_is_409_naming_what_holds_it(
    client: httpx.AsyncClient, tenant: Any, db: Database, dsn: DSN
) -> None:
    t = await tenant()
    url = f"{ns(t)}/queues/default"
    task = await t.submit(kind="k")
    sched = {"queue": "default", "every_ms": 3_600_000, "task": {"kind": "tick"}}
    assert (await client.put(f"{ns(t)}/schedules/hourly", json=sched, headers=t.auth)).status_code == 201
    info, _ = await open_session(db, t)
    r = await client.delete(url, headers=t.auth)
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "conflict"
    assert err["details"]["unfinished_tasks"] == 1
    assert err["details"]["schedules"] == ["hourly"]
    assert err["details"]["sessions"] == [id_hex(info.session_id)]
    assert "1 unfinished task" in err["message"] and "hourly" in err["message"]
    # release the holds one by one
    assert (await client.post(f"{ns(t)}/tasks/{task['id']}/cancel", headers=t.auth)).status_code == 200
    assert (await client.delete(f"{ns(t)}/schedules/hourly", headers=t.auth)).status_code == 204
    r = await client.delete(url, headers=t.auth)
    assert r.status_code == 409 and r.json()["error"]["details"]["unfinished_tasks"] == 0
    close = await client.post(f"{ns(t)}/workers/{id_hex(info.session_id)}/close", headers=t.auth)
    assert close.status_code == 200
    assert (await client.delete(url, headers=t.auth)).status_code == 204
    # the finished task stays readable by id
    kept = await client.get(f"{ns(t)}/tasks/{task['id']}", headers=t.auth)
    assert kept.status_code == 200 and kept.json()["state"] == "CANCELLED"
    denied = raw_query(
        dsn,
        "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action = 'queues.delete' AND outcome = 'conflict'",
        (t.namespace_id,),
    )
    assert denied == [(2,)]


async def test_a_submit_that_read_the_queue_before_its_delete_answers_404(
    tenant: Any, db: Database, dsn: DSN, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a delete must win: the submit has read the queue (no lock) when the delete
    commits, and only then locks the queue's usage row. It must not insert a task into the
    deleted queue: it finds no usage row and answers 404."""
    t = await tenant()
    queue_id = await t.add_queue("racy")
    real = submit.transitions.lock_usage
    deleted: list[bool] = []

    async def delete_first(*args: Any, **kwargs: Any) -> Any:
        if not deleted:
            await delete_queue(db, t.namespace_id, "racy")  # its own transaction, committed
            deleted.append(True)
        return await real(*args, **kwargs)

    monkeypatch.setattr(submit.transitions, "lock_usage", delete_first)
    with pytest.raises(QueueNotFound):
        await submit.submit_one(db, t.namespace_id, t.application_id,
                                TaskSubmit(queue="racy", kind="k"))  # fmt: skip
    assert deleted
    left = raw_query(
        dsn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND queue_id = %s",
        (t.namespace_id, queue_id),
    )  # fmt: skip
    assert left == [(0,)]


async def test_a_delete_waits_for_a_schedule_publish_that_names_the_queue(
    tenant: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish reads its queue under a shared lock: a delete that comes while the publish
    is open waits for it, then sees the schedule and answers 409 (else the schedule would
    target a queue that no longer exists)."""
    t = await tenant()
    await t.add_queue("target")
    real = schedule_service.store.version_insert
    racing: list[asyncio.Task[None]] = []

    async def delete_meanwhile(tx: Any, row: Any) -> None:
        if not racing:
            racing.append(asyncio.create_task(delete_queue(db, t.namespace_id, "target")))
            await asyncio.sleep(0.3)
            assert not racing[0].done(), "the delete did not wait for the publish"
        await real(tx, row)

    monkeypatch.setattr(schedule_service.store, "version_insert", delete_meanwhile)
    body = msgspec.json.decode(
        b'{"queue": "target", "every_ms": 60000, "task": {"kind": "k"}}',
        type=schedule_service.SchedulePut,
    )
    await schedule_service.put_schedule(db, t.namespace_id, t.application_id, "nightly", body)
    with pytest.raises(QueueInUse) as held:
        await racing[0]
    assert held.value.details["schedules"] == ["nightly"]


# ---------------------------------------------------------------------------- subscriptions


async def test_delete_a_subscription(
    client: httpx.AsyncClient, tenant: Any, db: Database, dsn: DSN
) -> None:
    t = await tenant()
    url = f"{ns(t)}/subscriptions/results"
    r = await client.put(url, json={"filter": {}, "start": "earliest"}, headers=t.auth)
    assert r.status_code == 201
    task = await t.submit(kind="k")
    await client.post(f"{ns(t)}/tasks/{task['id']}/cancel", headers=t.auth)
    pulled = await client.post(f"{url}/pull", json={"max": 5, "wait_ms": 0}, headers=t.auth)
    assert len(pulled.json()["deliveries"]) == 1
    other = await tenant()
    await same_404(client, "DELETE", url, other)
    _, consumer = await add_key(db, ptenant(t), ["subscriptions.consume"])
    assert (await client.delete(url, headers=bearer(consumer))).status_code == 403
    assert (await client.delete(url, headers={**t.auth, "If-Match": '"5"'})).status_code == 412
    assert (await client.delete(url, headers=t.auth)).status_code == 204
    assert (await client.get(url, headers=t.auth)).status_code == 404
    r = await client.post(f"{url}/pull", json={"max": 5, "wait_ms": 0}, headers=t.auth)
    assert r.status_code == 404
    kept = raw_query(  # rows, plus the slots of delivery ranges (first hand-outs)
        dsn, "SELECT (SELECT COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s)"
             " + (SELECT COALESCE(SUM(n), 0) FROM orbit_delivery_ranges WHERE namespace_id = %s)",
        (t.namespace_id, t.namespace_id),
    )  # fmt: skip
    assert [tuple(int(x) for x in r) for r in kept] == [(1,)]  # history stays
    fresh = await client.put(url, json={"filter": {}, "start": "latest"}, headers=t.auth)
    assert fresh.status_code == 201 and fresh.json()["revision"] == 1


# ---------------------------------------------------------------------------- workflows

WAITS = {
    "input_schema": {"object": {"order": "string"}},
    "steps": [
        {"id": "ship", "type": "wait_signal", "signal": "shipped",
         "correlation_key": "$.input.order"},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.ship.output"}},
    ],
}  # fmt: skip


async def test_delete_a_workflow_refused_while_instances_run(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    url = f"{ns(t)}/workflows/orders"
    r = await client.post(f"{url}/versions", json={"definition": WAITS}, headers=t.auth)
    assert r.status_code == 201
    start = await client.post(f"{url}/instances", json={"input": {"order": "o-1"}}, headers=t.auth)
    assert start.status_code == 201, start.text
    iid = start.json()["id"]
    r = await client.delete(url, headers=t.auth)
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["details"]["running_instances"] == 1 and err["details"]["instances"] == [iid]
    other = await tenant()
    await same_404(client, "DELETE", url, other)
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    assert (await client.delete(url, headers=bearer(reader))).status_code == 403
    assert (await client.post(f"{ns(t)}/instances/{iid}/cancel", headers=t.auth)).status_code == 200
    assert (await client.delete(url, headers=t.auth)).status_code == 204
    assert (await client.get(url, headers=t.auth)).status_code == 404
    assert (await client.get(f"{ns(t)}/instances/{iid}", headers=t.auth)).status_code == 200
    again = await client.post(f"{url}/versions", json={"definition": WAITS}, headers=t.auth)
    assert again.status_code == 201 and again.json()["version"] == 1


# ---------------------------------------------------------------------------- workers


async def _running(db: Database, hub: Hub, t: Tenant, **submit_fields: Any) -> tuple[Any, str]:
    task = await t.submit(**submit_fields)
    info, _ = await open_session(db, t, max_concurrency=3)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    started = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(started, wire.Started)
    return info, task["id"]


async def test_workers_view(client: httpx.AsyncClient, tenant: Any, db: Database) -> None:
    t = await tenant()
    await t.add_queue("other")
    hub = Hub("node-ops")
    busy, task_id = await _running(db, hub, t)
    idle, _ = await open_session(db, t, queues=["other"], max_concurrency=7)
    r = await client.get(f"{ns(t)}/workers", headers=t.auth)
    assert r.status_code == 200, r.text
    sessions = {s["id"]: s for s in r.json()["sessions"]}
    assert r.json()["next_cursor"] is None
    b = sessions[id_hex(busy.session_id)]
    assert b["state"] == "ACTIVE" and b["live"] and b["queues"] == ["default"]
    assert b["capacity"] == 3 and b["in_flight"] == 1 and b["running"] == 1 and b["free"] == 2
    assert b["attempts"][0]["task_id"] == task_id and b["attempts"][0]["state"] == "RUNNING"
    assert b["instance"]["host"] == "test-host" and b["instance"]["pid"] == 1234
    assert b["sdk"] == "tests/0" and b["node"] == "node-ops" and b["connected"] is True
    assert 0 <= b["heartbeat_age_ms"] < 60_000 and b["expires_at"].endswith("Z")
    i = sessions[id_hex(idle.session_id)]
    assert i["in_flight"] == 0 and i["capacity"] == 7 and i["node"] is None
    r = await client.get(f"{ns(t)}/workers?queue=other", headers=t.auth)
    assert [s["id"] for s in r.json()["sessions"]] == [id_hex(idle.session_id)]
    page = await client.get(f"{ns(t)}/workers?limit=1", headers=t.auth)
    assert len(page.json()["sessions"]) == 1 and page.json()["next_cursor"]
    rest = await client.get(
        f"{ns(t)}/workers?limit=1&cursor={page.json()['next_cursor']}", headers=t.auth
    )
    assert len(rest.json()["sessions"]) == 1 and rest.json()["next_cursor"] is None
    bad = await client.get(f"{ns(t)}/workers?state=ACTIVE&cursor={page.json()['next_cursor']}&queue=x",
                           headers=t.auth)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "cursor"
    assert (await client.get(f"{ns(t)}/workers?state=gone", headers=t.auth)).status_code == 400
    # actions and isolation
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    assert (await client.get(f"{ns(t)}/workers", headers=bearer(reader))).status_code == 200
    _, submitter = await add_key(db, ptenant(t), ["tasks.submit"])
    assert (await client.get(f"{ns(t)}/workers", headers=bearer(submitter))).status_code == 403
    _, limited = await add_key(db, ptenant(t), ["tasks.read"], queues=["other"])
    assert (await client.get(f"{ns(t)}/workers", headers=bearer(limited))).status_code == 403
    r = await client.get(f"{ns(t)}/workers?queue=other", headers=bearer(limited))
    assert r.status_code == 200 and len(r.json()["sessions"]) == 1
    other = await tenant()
    await same_404(client, "GET", f"{ns(t)}/workers", other)
    theirs = await client.get(f"{ns(other)}/workers", headers=other.auth)
    assert theirs.json()["sessions"] == []


async def test_an_operator_closes_a_session(
    client: httpx.AsyncClient, tenant: Any, db: Database, dsn: DSN
) -> None:
    t = await tenant()
    hub = Hub("node-ops-close")
    info, task_id = await _running(db, hub, t)  # not retry_safe: its effect is uncertain
    sid = id_hex(info.session_id)
    url = f"{ns(t)}/workers/{sid}/close"
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    assert (await client.post(url, headers=bearer(reader))).status_code == 403
    other = await tenant()
    await same_404(client, "POST", url, other)
    assert (await client.post(f"{ns(t)}/workers/{'0' * 32}/close", headers=t.auth)).status_code == 404
    assert (await client.post(f"{ns(t)}/workers/nothex/close", headers=t.auth)).status_code == 404
    r = await client.post(url, headers=t.auth)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CLOSED" and r.json()["lost_attempts"] == 1
    row = await task_row(db, t, task_id)
    assert row["state"] == "NEEDS_REVIEW" and row["effect_uncertain"] == 1
    again = await client.post(url, headers=t.auth)
    assert again.status_code == 200 and again.json()["lost_attempts"] == 0
    listed = await client.get(f"{ns(t)}/workers?state=CLOSED", headers=t.auth)
    assert [s["id"] for s in listed.json()["sessions"]] == [sid]
    assert (await client.get(f"{ns(t)}/workers", headers=t.auth)).json()["sessions"] == []
    retry_safe, safe_task = await _running(db, hub, t, retry_safe=True)
    r = await client.post(f"{ns(t)}/workers/{id_hex(retry_safe.session_id)}/close", headers=t.auth)
    assert r.json()["lost_attempts"] == 1
    assert (await task_row(db, t, safe_task))["state"] == "WAITING"
    audited = raw_query(
        dsn,
        "SELECT resource_id, JSON_VALUE(details, '$.reason') FROM orbit_audit_events"
        " WHERE namespace_id = %s AND action = 'workers.close' AND outcome = 'ok'",
        (t.namespace_id,),
    )
    assert sorted(audited) == sorted([(sid, "closed_by_operator"),
                                      (id_hex(retry_safe.session_id), "closed_by_operator")])  # fmt: skip


# ---------------------------------------------------------------------------- audit


async def test_audit_list_filters_and_pages(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    await t.add_queue("a1")
    await t.add_queue("a2")
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    assert (await client.delete(f"{ns(t)}/queues/a1", headers=bearer(reader))).status_code == 403
    assert (await client.delete(f"{ns(t)}/queues/a1", headers=t.auth)).status_code == 204
    assert (await client.delete(f"{ns(t)}/queues/a2", headers=t.auth)).status_code == 204
    stranger = await tenant()  # its events are in its own namespace's list only
    assert (await client.delete(f"{ns(stranger)}/queues/default",
                                headers=stranger.auth)).status_code == 204  # fmt: skip
    url = f"{ns(t)}/audit"
    r = await client.get(url, headers=t.auth)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [(i["action"], i["resource_id"], i["outcome"]) for i in items[:3]] == [
        ("queues.delete", "a2", "ok"), ("queues.delete", "a1", "ok"),
        ("queues.manage", t.namespace, "denied"),
    ]  # fmt: skip
    assert items[2]["status_code"] == 403
    assert items[0]["actor"]["credential_id"] == id_hex(t.credential_id)
    assert items[0]["actor"]["credential_name"] and items[0]["created_at"].endswith("Z")
    assert all(i["created_at"] >= j["created_at"] for i, j in itertools.pairwise(items))
    assert not [i for i in items if i["resource_id"] == "default" and i["action"] == "queues.delete"]
    denied = await client.get(f"{url}?outcome=denied", headers=t.auth)
    assert [i["action"] for i in denied.json()["items"]] == ["queues.manage"]
    deletes = await client.get(f"{url}?action=queues.delete&outcome=ok", headers=t.auth)
    assert [i["resource_id"] for i in deletes.json()["items"]] == ["a2", "a1"]
    first = await client.get(f"{url}?action=queues.delete&limit=1", headers=t.auth)
    nxt = first.json()["next_cursor"]
    assert nxt and first.json()["items"][0]["resource_id"] == "a2"
    rest = await client.get(f"{url}?action=queues.delete&limit=5&cursor={nxt}", headers=t.auth)
    assert [i["resource_id"] for i in rest.json()["items"]] == ["a1"]
    assert rest.json()["next_cursor"] is None
    bad = await client.get(f"{url}?action=queues.put&cursor={nxt}", headers=t.auth)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "cursor"
    cut = items[1]["created_at"]
    newer = await client.get(f"{url}?since={cut}", headers=t.auth)
    assert items[1]["id"] in [i["id"] for i in newer.json()["items"]]
    older = await client.get(f"{url}?until={cut}", headers=t.auth)
    assert items[1]["id"] not in [i["id"] for i in older.json()["items"]]
    for query, field in (("outcome=maybe", "outcome"), ("since=yesterday", "since"),
                         (f"since={cut}&until={cut}", "until"), ("limit=0", "limit")):  # fmt: skip
        r = await client.get(f"{url}?{query}", headers=t.auth)
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == field
    assert (await client.get(url, headers=bearer(reader))).status_code == 403
    await same_404(client, "GET", url, stranger)


async def test_queue_limited_keys_on_the_operator_routes(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    await t.add_queue("mine")
    _, limited = await add_key(
        db, ptenant(t), ["admin", "subscriptions.manage", "workflows.manage"], queues=["mine"]
    )
    h = bearer(limited)
    # the audit trail covers every queue: an unlimited key only
    r = await client.get(f"{ns(t)}/audit", headers=h)
    assert r.status_code == 403
    # a subscription the key cannot see (no queue filter) is the same 404 as an absent one
    wide = f"{ns(t)}/subscriptions/wide"
    assert (await client.put(wide, json={"filter": {}}, headers=t.auth)).status_code == 201
    assert (await client.delete(wide, headers=h)).status_code == 404
    narrow = f"{ns(t)}/subscriptions/narrow"
    r = await client.put(narrow, json={"filter": {"queues": ["mine"]}}, headers=t.auth)
    assert r.status_code == 201
    assert (await client.delete(narrow, headers=h)).status_code == 204
    # workflows may use any queue: a limited key deletes none
    doc = {"steps": [{"id": "done", "type": "succeed", "output": {}}]}
    url = f"{ns(t)}/workflows/flow"
    assert (await client.post(f"{url}/versions", json={"definition": doc}, headers=t.auth)).status_code == 201
    assert (await client.delete(url, headers=h)).status_code == 403
    assert (await client.delete(url, headers=t.auth)).status_code == 204
