"""A task's history end to end (httpx over ASGI, real database, a real dispatch, start and
report): ``GET …/tasks/{id}/events`` lists the task's raw state events in order, pages by
cursor without splitting a transaction, reads a bounded part of a busy namespace's log per
page, sees a re-run through, and answers 404 to another tenant, to a key limited to other
queues and for a malformed id; 403 without ``tasks.read``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from platform_fixtures import PTenant, add_key, asgi_client, bearer, make_app, pulse_routes
from pulse_fixtures import Tenant
from pulse_worker_support import connect, open_session

from orbit import events as orbit_events
from orbit.ids import new_id, parse_id
from orbit.storage import Database, Tx
from pulse import attempts, task_history, wire
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


def url(t: Tenant, task_id: str) -> str:
    return f"/v1/namespaces/{t.namespace}/tasks/{task_id}/events"


async def run_task(db: Database, t: Tenant, *, fail: bool = False) -> str:
    """A task dispatched, started and completed (or failed for good) by a real session."""
    hub = Hub("node-history")
    task = await t.submit(max_attempts=1, payload={"n": 1})
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    if fail:
        rep = Report(
            "fail", aid, started.execution_token, error=wire.FailError(type="Boom", message="x")
        )
    else:
        rep = Report("complete", aid, started.execution_token, result=b'{"ok":true}')
    await attempts.report(db, t.namespace_id, rep)
    return str(task["id"])


async def test_the_history_of_a_finished_task(client: httpx.AsyncClient, tenant: Any) -> None:
    t = await tenant()
    task_id = await run_task(db=t.db, t=t)
    await t.submit()  # another task's events are not this task's history
    r = await client.get(url(t, task_id), headers=t.auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["task_id"] == task_id and body["next_cursor"] is None
    types = [e["type"] for e in body["events"]]
    assert types == ["task.accepted", "task.leased", "task.started", "task.succeeded"]
    versions = [e["data"]["state_version"] for e in body["events"]]
    assert versions == sorted(versions)
    assert [e["data"]["state"] for e in body["events"]] == [
        "WAITING",
        "LEASED",
        "RUNNING",
        "SUCCEEDED",
    ]
    times = [e["created_at"] for e in body["events"]]
    assert times == sorted(times) and all(x.endswith("Z") for x in times)
    assert {"type", "created_at", "request_id", "data"} <= set(body["events"][0])
    # pages of one event each give the same events in the same order
    seen, cursor = [], None
    for _ in range(10):
        q: dict[str, Any] = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = (await client.get(url(t, task_id), params=q, headers=t.auth)).json()
        seen += [e["type"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == types


async def test_a_rerun_task_shows_both_runs(client: httpx.AsyncClient, tenant: Any) -> None:
    t = await tenant()
    task_id = await run_task(t.db, t, fail=True)
    r = await client.post(
        f"/v1/namespaces/{t.namespace}/tasks/{task_id}/retry",
        json={"note": "again"},
        headers=t.auth,
    )
    assert r.status_code == 200, r.text
    body = (await client.get(url(t, task_id), headers=t.auth)).json()
    types = [e["type"] for e in body["events"]]
    assert types[-2:] == ["task.failed", "task.rerun"], types


async def test_rights_isolation_and_bad_input(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    await t.add_queue("other")
    task = await t.submit(queue="other")
    path = url(t, task["id"])
    other = await tenant()
    absent = await client.get(url(other, new_id().hex()), headers=other.auth)
    theirs = await client.get(path.replace(t.namespace, other.namespace), headers=other.auth)
    assert absent.status_code == theirs.status_code == 404
    assert absent.json() == theirs.json()
    # the other tenant's key on this namespace's path: the namespace is not theirs
    assert (await client.get(path, headers=other.auth)).status_code == 404
    _, limited = await add_key(db, ptenant(t), ["tasks.read"], queues=["default"])
    hidden = await client.get(path, headers=bearer(limited))
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
    _, allowed = await add_key(db, ptenant(t), ["tasks.read"], queues=["other"])
    assert (await client.get(path, headers=bearer(allowed))).status_code == 200
    _, writer = await add_key(db, ptenant(t), ["tasks.submit"])
    assert (await client.get(path, headers=bearer(writer))).status_code == 403
    assert (await client.get(url(t, "nope"), headers=t.auth)).status_code == 404
    r = await client.get(path, params={"limit": 0}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "limit"
    r = await client.get(path, params={"cursor": "garbage"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "cursor"
    # a cursor of another task's history is refused
    run = await run_task(db, t)
    first = (await client.get(url(t, run), params={"limit": 1}, headers=t.auth)).json()
    r = await client.get(path, params={"cursor": first["next_cursor"]}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "cursor"


async def test_a_busy_namespace_is_read_in_bounded_steps(tenant: Any, db: Database) -> None:
    """Thousands of other batch rows inside the task's lifetime: every page reads at most
    SCANS_PER_PAGE bounded scans, pages continue where the previous stopped, and every
    event of the task comes back once, in order."""
    t = await tenant()
    task = await t.submit()
    tid = bytes.fromhex(task["id"])
    created = (await db.read(lambda tx: tx.fetchval(
        "SELECT created_at FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
        (t.namespace_id, tid),
    )))  # fmt: skip
    noise = [
        (t.namespace_id, orbit_events.NewEvent(type="queue.updated", subject_kind="queue",
                                               subject_id=new_id(), data={"i": i}))
        for i in range(1)
    ]  # fmt: skip

    async def write(tx: Tx) -> None:
        for i in range(9_000):
            at = created + timedelta(microseconds=1 + i)
            if i % 1_500 == 0:  # one event of the task every 1,500 rows of noise
                e = orbit_events.NewEvent(type="task.stuck", subject_kind="task", subject_id=tid,
                                          data={"state_version": 1, "i": i})  # fmt: skip
                await orbit_events.append_events_across(tx, [(t.namespace_id, e)], now=at)
            await orbit_events.append_events_across(tx, noise, now=at)

    await db.transaction(write)
    seen: list[int] = []
    cursor, pages = None, 0
    while True:
        page = await task_history.task_events(
            db, t.namespace_id, task["id"], limit=50, cursor=cursor
        )
        pages += 1
        seen += [e["data"].get("i", -1) for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [-1, 0, 1500, 3000, 4500, 6000, 7500]
    rows_per_page = task_history.SCANS_PER_PAGE * orbit_events.HISTORY_SCAN_ROWS
    assert pages >= 9_000 // rows_per_page
