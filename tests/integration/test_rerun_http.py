"""Re-running finished tasks end to end (httpx over ASGI, real database, a real dispatch and
start): FAILED / CANCELLED → WAITING with a new generation and the history kept, other
states 409, quotas, the bulk re-run by filter (dry run, error type, time range, batches),
actions, queue-limited keys and tenant isolation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from event_rows import raw_events
from platform_fixtures import (
    PTenant,
    add_key,
    asgi_client,
    bearer,
    make_app,
    pulse_routes,
    raw_query,
)
from pulse_fixtures import Tenant
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.audit import Actor
from orbit.ids import parse_id
from orbit.storage import DSN, Database
from pulse import attempts, rerun, wire
from pulse import tasks as task_service
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, pulse_routes)) as c:
        yield c


def ptenant(t: Tenant) -> PTenant:
    return PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )


def ns(t: Tenant) -> str:
    return f"/v1/namespaces/{t.namespace}"


async def failed_task(
    db: Database, t: Tenant, *, error_type: str = "Boom", queue: str | None = None, **fields: Any
) -> str:
    """A task run by a real session that fails for good (not retryable): its id."""
    hub = Hub("node-rerun")
    task = await t.submit(queue=queue or t.queue, max_attempts=1, **fields)
    info, _ = await open_session(db, t, queues=[queue or t.queue])
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    err = wire.FailError(type=error_type, message="it broke")
    receipt = await attempts.report(
        db, t.namespace_id, Report("fail", aid, started.execution_token, error=err)
    )
    assert receipt.task_state == "FAILED"
    return str(task["id"])


async def test_rerun_a_failed_task(client: httpx.AsyncClient, tenant: Any, db: Database, dsn: DSN) -> None:
    t = await tenant()
    task_id = await failed_task(db, t)
    url = f"{ns(t)}/tasks/{task_id}/retry"
    r = await client.post(url, json={}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "note"
    r = await client.post(url, json={"note": "fixed the handler"}, headers=t.auth)
    assert r.status_code == 200, r.text
    task = r.json()
    assert task["state"] == "WAITING" and task["attempts"] == 1 and task["max_attempts"] == 2
    assert task["error"] is None and task["finished_at"] is None
    assert task["resolution"]["action"] == "rerun" and task["resolution"]["note"] == "fixed the handler"
    assert task["resolution"]["previous_state"] == "FAILED"
    assert task["resolution"]["previous_error"]["type"] == "Boom"
    await check_invariants(db, t.namespace_id)
    # the attempts history stays; the next attempt is generation 2
    listed = await client.get(f"{ns(t)}/tasks/{task_id}/attempts", headers=t.auth)
    assert [a["generation"] for a in listed.json()["items"]] == [1]
    assert [e["kind"] for e in listed.json()["evidence"]] == ["operator_rerun"]
    hub = Hub("node-rerun-2")
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    started = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(started, wire.Started) and started.generation == 2
    # not finished now: 409; nor another tenant's: 404
    r = await client.post(url, json={"note": "again"}, headers=t.auth)
    assert r.status_code == 409 and r.json()["error"]["details"]["state"] == "RUNNING"
    other = await tenant()
    r = await client.post(url, json={"note": "x"}, headers=other.auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    events = await db.read(
        lambda tx: raw_events(tx, t.namespace_id, subject_id=bytes.fromhex(task_id))
    )
    assert "task.rerun" in [e["type"] for e in events]
    audited = raw_query(
        dsn, "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action = 'tasks.retry' AND outcome = 'ok'", (t.namespace_id,),
    )  # fmt: skip
    assert audited == [(1,)]


async def test_rerun_a_cancelled_task_rules_and_rights(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    waiting = await t.submit(kind="k")
    url = f"{ns(t)}/tasks/{waiting['id']}/retry"
    r = await client.post(url, json={"note": "n"}, headers=t.auth)
    assert r.status_code == 409 and r.json()["error"]["details"]["state"] == "WAITING"
    await client.post(f"{ns(t)}/tasks/{waiting['id']}/cancel", headers=t.auth)
    _, reader = await add_key(db, ptenant(t), ["tasks.read", "tasks.cancel"])
    assert (await client.post(url, json={"note": "n"}, headers=bearer(reader))).status_code == 403
    await t.add_queue("private")
    _, limited = await add_key(db, ptenant(t), ["tasks.resolve"], queues=["private"])
    r = await client.post(url, json={"note": "n"}, headers=bearer(limited))
    assert r.status_code == 404  # a queue the key may not use: same as absent
    r = await client.post(url, json={"note": "n", "attempts": 3}, headers=t.auth)
    assert r.status_code == 200
    task = r.json()
    assert task["state"] == "WAITING" and task["attempts"] == 0 and task["max_attempts"] == 3
    bad = await client.post(f"{ns(t)}/tasks/{'0' * 32}/retry", json={"note": "n"}, headers=t.auth)
    assert bad.status_code == 404
    assert (await client.post(url, json={"note": "n", "attempts": 0}, headers=t.auth)).status_code == 400


async def test_rerun_respects_the_queue_quota(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant(max_unfinished_tasks=1)
    first = await t.submit(kind="k")
    await client.post(f"{ns(t)}/tasks/{first['id']}/cancel", headers=t.auth)
    await t.submit(kind="k")  # the queue is full again
    r = await client.post(f"{ns(t)}/tasks/{first['id']}/retry", json={"note": "n"}, headers=t.auth)
    assert r.status_code == 429 and r.headers["Retry-After"]
    assert (await task_row(db, t, first["id"]))["state"] == "CANCELLED"


async def test_bulk_rerun_by_filter(client: httpx.AsyncClient, tenant: Any, db: Database) -> None:
    t = await tenant()
    await t.add_queue("other")
    boom = [await failed_task(db, t, error_type="Boom") for _ in range(3)]
    bang = await failed_task(db, t, error_type="Bang")
    elsewhere = await failed_task(db, t, error_type="Boom", queue="other")
    cancelled = await t.submit(kind="k")
    await client.post(f"{ns(t)}/tasks/{cancelled['id']}/cancel", headers=t.auth)
    url = f"{ns(t)}/tasks:retry"
    body = {"note": "after the outage", "queue": t.queue, "error_type": "Boom", "states": ["FAILED"]}
    r = await client.post(url, json={**body, "dry_run": True}, headers=t.auth)
    assert r.status_code == 200 and r.json() == {"matched": 3, "more": False}
    r = await client.post(url, json={**body, "states": ["FAILED", "CANCELLED"], "dry_run": True},
                          headers=t.auth)  # fmt: skip
    assert r.json()["matched"] == 3  # the cancelled one has no error type
    r = await client.post(url, json={"note": "n", "dry_run": True}, headers=t.auth)
    assert r.json()["matched"] == 6
    r = await client.post(url, json=body, headers=t.auth)
    assert r.status_code == 200 and r.json() == {"retried": 3, "quota_refused": 0}
    for task_id in boom:
        assert (await task_row(db, t, task_id))["state"] == "WAITING"
    for task_id in (bang, elsewhere):
        assert (await task_row(db, t, task_id))["state"] == "FAILED"
    assert (await client.post(url, json=body, headers=t.auth)).json()["retried"] == 0
    # a time range that ends before everything matches nothing
    early = {"note": "n", "finished_before": "2000-01-01T00:00:00Z", "dry_run": True}
    assert (await client.post(url, json=early, headers=t.auth)).json()["matched"] == 0
    r = await client.post(url, json={"note": "n", "finished_after": "2030-01-01T00:00:00Z",
                                     "finished_before": "2020-01-01T00:00:00Z"}, headers=t.auth)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "finished_before"
    r = await client.post(url, json={"note": "n", "owner_id": "zz"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "owner_id"
    assert (await client.post(url, json={"note": "n", "queue": "nope"}, headers=t.auth)).json() == {
        "retried": 0, "quota_refused": 0}  # fmt: skip
    _, limited = await add_key(db, ptenant(t), ["tasks.resolve"], queues=["other"])
    assert (await client.post(url, json={"note": "n"}, headers=bearer(limited))).status_code == 403
    r = await client.post(url, json={"note": "n", "queue": "other"}, headers=bearer(limited))
    assert r.json()["retried"] == 1
    await check_invariants(db, t.namespace_id)


async def test_bulk_rerun_in_small_batches_and_quota_stop(tenant: Any, db: Database) -> None:
    t = await tenant(max_unfinished_tasks=4)
    ids = []
    for _ in range(6):  # finished one after the other: the finish order is the id order here
        task = await t.submit(kind="k")
        await task_service.cancel_task(db, t.namespace_id, task["id"])
        ids.append(task["id"])
    body = msgspec.convert({"note": "n"}, rerun.RerunBulk)
    actor = Actor(t.credential_id, t.application_id)
    out = await rerun.rerun_bulk(db, t.namespace_id, body, actor=actor, batch=2)
    assert out == {"retried": 4, "quota_refused": 2}
    states = [(await task_row(db, t, i))["state"] for i in ids]
    assert states == ["WAITING"] * 4 + ["CANCELLED"] * 2  # oldest finish first
    await check_invariants(db, t.namespace_id)
