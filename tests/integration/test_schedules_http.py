"""Schedule routes end to end (httpx over ASGI, real database, database clock): status codes,
ETag / If-Match / If-None-Match, error bodies, authorization, occurrences written by a
scheduler running on the database clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from platform_fixtures import PTenant, add_key, bearer, make_app, pulse_routes
from pulse_fixtures import Tenant
from schedule_support import isolated_dsn, quiesce, tenant

from orbit.storage import DSN, Database
from pulse.scheduler import Scheduler


@pytest.fixture(scope="module")
def sched_dsn() -> Iterator[DSN]:
    yield from isolated_dsn()


@pytest.fixture(scope="module")
async def sdb(sched_dsn: DSN) -> AsyncIterator[Database]:
    database = await Database.connect(sched_dsn, maxsize=6)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def http(sdb: Database, sched_dsn: DSN) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(sdb, pulse_routes)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://orbit.test"
    ) as client:
        yield client
    quiesce(sched_dsn)


def url(t: Tenant, name: str = "nightly") -> str:
    return f"/v1/namespaces/{t.namespace}/schedules/{name}"


BODY: dict[str, Any] = {
    "queue": "default",
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "task": {"kind": "report", "payload": {"x": 1.50}, "priority": 3, "pipeline_version": "v1"},
    "catchup_window_ms": 600_000,
    "grace_ms": 30_000,
}


def ptenant(t: Tenant) -> PTenant:
    return PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )


async def test_put_get_versions_and_preconditions(http: httpx.AsyncClient, sdb: Database) -> None:
    t = await tenant(sdb)
    r = await http.put(url(t), json=BODY, headers={**t.auth, "If-None-Match": "*"})
    assert r.status_code == 201 and r.headers["ETag"] == '"1"'
    s = r.json()
    assert s["version"] == 1 and s["cron"] == "0 3 * * *" and s["timezone"] == "Europe/Berlin"
    assert s["owner_id"] == t.owner_hex and s["next_fire_at"].endswith("Z")
    assert s["next_fire_at_local"][11:19] == "03:00:00" and s["paused"] is False
    assert s["task"]["kind"] == "report" and s["task"]["priority"] == 3
    raw = b'{"queue": "default", "every_ms": 60000, "task": {"kind": "k", "payload": {"n": 1.50}}}'
    r = await http.put(url(t), content=raw, headers={**t.auth, "If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["error"]["code"] == "precondition_failed"
    r = await http.put(url(t), content=raw, headers={**t.auth, "If-Match": '"7"'})
    assert r.status_code == 412 and r.json()["error"]["details"]["current_revision"] == 1
    r = await http.put(url(t), content=raw, headers={**t.auth, "If-Match": '"1"'})
    assert r.status_code == 200 and r.headers["ETag"] == '"2"'
    assert r.json()["version"] == 2 and r.json()["every_ms"] == 60000 and r.json()["cron"] is None
    assert b'"payload":{"n": 1.50}' in r.content  # the template payload is byte-exact
    r = await http.put(url(t), content=raw, headers=t.auth)  # identical: no-op
    assert r.status_code == 200 and r.headers["ETag"] == '"2"' and r.json()["version"] == 2
    r = await http.get(url(t), headers=t.auth)
    assert r.status_code == 200 and r.headers["ETag"] == '"2"' and r.json()["version"] == 2
    r = await http.put(url(t, "fresh"), json=BODY, headers={**t.auth, "If-Match": "*"})
    assert r.status_code == 412  # If-Match: * needs an existing schedule
    listed = (await http.get(f"/v1/namespaces/{t.namespace}/schedules", headers=t.auth)).json()
    assert [i["name"] for i in listed["items"]] == ["nightly"] and listed["next_cursor"] is None


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"cronn": "0 * * * *"}, "cronn"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "0 * * * * * *"}, "cron"),
        ({"timezone": "Mars/Base"}, "timezone"),
        ({"every_ms": 60000}, "cron"),
        ({"every_ms": 999, "cron": None}, "every_ms"),
        ({"task": {"kind": ""}}, "task.kind"),
        ({"task": {"kind": "k", "priority": 10}}, "task.priority"),
        ({"start_at": "2030-01-01"}, "start_at"),
        ({"grace_ms": -5}, "grace_ms"),
    ],
)
async def test_invalid_bodies_are_400_with_the_field(
    http: httpx.AsyncClient, sdb: Database, patch: dict[str, Any], field: str
) -> None:
    t = await tenant(sdb)
    r = await http.put(url(t), json={**BODY, **patch}, headers=t.auth)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    assert r.json()["error"]["details"]["field"] == field
    r = await http.put(url(t, "bad name"), json=BODY, headers=t.auth)
    assert r.status_code == 400


async def test_authorization_and_visibility(http: httpx.AsyncClient, sdb: Database) -> None:
    t = await tenant(sdb)
    assert (await http.put(url(t), json=BODY, headers=t.auth)).status_code == 201
    _, reader = await add_key(sdb, ptenant(t), ["tasks.read"])
    h = bearer(reader)
    assert (await http.get(url(t), headers=h)).status_code == 200
    assert (await http.get(f"{url(t)}/occurrences", headers=h)).status_code == 200
    assert (await http.put(url(t), json=BODY, headers=h)).status_code == 403
    assert (await http.post(f"{url(t)}/pause", headers=h)).status_code == 403
    _, nobody = await add_key(sdb, ptenant(t), ["tasks.submit"])
    r = await http.get(url(t), headers=bearer(nobody))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert (await http.get(url(t))).status_code == 401
    assert (await http.get(url(t, "absent"), headers=t.auth)).status_code == 404
    other = await tenant(sdb)  # another application's key: the namespace is not found
    r = await http.get(url(t), headers=other.auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # a key limited to queue "default"
    await t.add_queue("secret")
    secret = {**BODY, "queue": "secret"}
    assert (await http.put(url(t, "hidden"), json=secret, headers=t.auth)).status_code == 201
    _, limited = await add_key(sdb, ptenant(t), ["schedules.manage"], queues=["default"])
    h = bearer(limited)
    assert (await http.get(url(t, "hidden"), headers=h)).status_code == 404
    assert (await http.get(url(t), headers=h)).status_code == 200
    assert (await http.put(url(t, "new"), json=secret, headers=h)).status_code == 403
    assert (await http.put(url(t, "hidden"), json=BODY, headers=h)).status_code == 404
    r = await http.put(url(t), json={**BODY, "queue": "nope"}, headers=t.auth)
    assert r.status_code == 404


async def test_pause_resume_and_occurrences_on_the_database_clock(
    http: httpx.AsyncClient, sdb: Database
) -> None:
    t = await tenant(sdb)
    body = {"queue": "default", "every_ms": 1000, "task": {"kind": "tick"}, "grace_ms": 5000}
    r = await http.put(url(t, "tick"), json=body, headers=t.auth)
    assert r.status_code == 201
    await asyncio.sleep(1.3)
    stats = await Scheduler(sdb).run_once()  # production mode: the database clock decides
    assert stats.errors == 0
    r = await http.get(f"{url(t, 'tick')}/occurrences", headers=t.auth)
    assert r.status_code == 200
    items = r.json()["items"]
    assert items and all(i["outcome"] == "created" and i["task_id"] for i in items)
    first = items[-1]
    assert set(first) >= {"fire_at", "fire_at_local", "version", "task_id", "outcome", "late",
                          "covered_until", "skipped_count"}  # fmt: skip
    assert first["fire_at"].endswith(".000000Z") and first["version"] == 1
    task = await http.get(f"/v1/namespaces/{t.namespace}/tasks/{first['task_id']}", headers=t.auth)
    assert task.status_code == 200 and task.json()["owner_id"] == t.owner_hex
    r = await http.post(f"{url(t, 'tick')}/pause", headers=t.auth)
    assert r.status_code == 200 and r.json()["paused"] is True
    assert r.headers["ETag"] == '"1"'  # pausing is not a configuration change
    rev = r.json()["control_revision"]
    r = await http.post(f"{url(t, 'tick')}/pause", headers=t.auth)
    assert r.json()["control_revision"] == rev  # idempotent
    await asyncio.sleep(1.2)
    r = await http.post(f"{url(t, 'tick')}/resume", headers=t.auth)
    assert r.status_code == 200 and r.json()["paused"] is False
    assert r.json()["control_revision"] == rev + 1
    r = await http.get(f"{url(t, 'tick')}/occurrences?outcome=skipped", headers=t.auth)
    [skip] = r.json()["items"]
    assert skip["reason"] == "paused" and skip["skipped_count"] >= 1 and skip["task_id"] is None
    r = await http.get(f"{url(t, 'tick')}/occurrences?limit=1", headers=t.auth)
    assert len(r.json()["items"]) == 1 and r.json()["next_cursor"]
    nxt = await http.get(
        f"{url(t, 'tick')}/occurrences?limit=1&cursor={r.json()['next_cursor']}", headers=t.auth
    )
    assert (
        nxt.status_code == 200
        and nxt.json()["items"][0]["fire_at"] < r.json()["items"][0]["fire_at"]
    )
    bad = await http.get(
        f"{url(t, 'tick')}/occurrences?outcome=created&cursor={r.json()['next_cursor']}",
        headers=t.auth,
    )
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "cursor"
    assert (await http.post(f"{url(t, 'nope')}/pause", headers=t.auth)).status_code == 404


async def test_the_loop_runs_until_stopped(http: httpx.AsyncClient, sdb: Database) -> None:
    """``Scheduler.run(stop)`` (what the composition root starts) fires on the database clock
    and returns promptly once ``stop`` is set."""
    t = await tenant(sdb)
    body = {"queue": "default", "every_ms": 1000, "task": {"kind": "tick"}}
    assert (await http.put(url(t, "loop"), json=body, headers=t.auth)).status_code == 201
    stop = asyncio.Event()
    loop = asyncio.create_task(Scheduler(sdb, interval_s=0.05).run(stop))
    await asyncio.sleep(2.2)
    stop.set()
    await asyncio.wait_for(loop, 2.0)
    r = await http.get(f"{url(t, 'loop')}/occurrences", headers=t.auth)
    items = r.json()["items"]
    assert len(items) >= 2 and all(i["outcome"] == "created" and not i["late"] for i in items)
