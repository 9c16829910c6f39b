"""The stuck-work watchdog over HTTP (httpx over ASGI, real database) and through the SDK:
``GET …/tasks?stuck=true``, the stuck fields of the task view, the queue GET's usage
(counters, every denial kind, ``stuck_tasks``), and ``OrbitClient.tasks.list(stuck=True)``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from orbit_sdk import OrbitClient
from platform_fixtures import make_app, pulse_routes
from pulse_fixtures import Tenant, force_state

from orbit.storage import Database, Tx
from pulse.watchdog import surface_queue

BOUND_MS = 5_000


@pytest.fixture
async def http(db) -> Any:
    app = make_app(db, pulse_routes)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://orbit.test"
    ) as client:
        yield client


async def make_stuck(db: Database, t: Tenant, task_id: str) -> None:
    """Age the task past the bound (its timestamps move back) and run the watchdog step."""

    async def run(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_tasks SET state_changed_at = state_changed_at - INTERVAL 10 SECOND,"
            " created_at = created_at - INTERVAL 10 SECOND"
            " WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, bytes.fromhex(task_id)),
        )

    await db.transaction(run)
    surfaced = await surface_queue(db, t.namespace_id, t.queue_id, BOUND_MS)
    assert task_id in {s["id"].hex() for s in surfaced}


async def test_stuck_filter_and_fields_over_http(http, db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    url = f"/v1/namespaces/{t.namespace}/tasks"
    calm = (await t.submit())["id"]
    stuck = (await t.submit())["id"]
    await force_state(db, t, stuck, "RUNNING")
    await make_stuck(db, t, stuck)

    r = await http.get(url, params={"stuck": "true"}, headers=t.auth)
    assert r.status_code == 200
    [item] = r.json()["items"]
    assert item["id"] == stuck and item["state"] == "RUNNING"
    assert item["stuck_at"].endswith("Z")
    assert item["stuck_reason"].startswith(
        f"RUNNING for 10 s > stuck_after_ms {BOUND_MS} on queue default: "
    )  # then the cause (who holds the attempt, or that its session is gone)
    r = await http.get(url, params={"stuck": "false"}, headers=t.auth)
    assert [i["id"] for i in r.json()["items"]] == [calm]
    r = await http.get(url, headers=t.auth)
    assert {i["id"] for i in r.json()["items"]} == {calm, stuck}
    got = (await http.get(f"{url}/{calm}", headers=t.auth)).json()
    assert got["stuck_at"] is None and got["stuck_reason"] is None
    got = (await http.get(f"{url}/{stuck}", headers=t.auth)).json()
    assert got["stuck_reason"] == item["stuck_reason"]

    r = await http.get(url, params={"stuck": "maybe"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "stuck"
    page = (await http.get(url, params={"stuck": "1", "limit": 1}, headers=t.auth)).json()
    assert page["next_cursor"] is None  # one stuck task: one page
    first = (await http.get(url, params={"limit": 1}, headers=t.auth)).json()
    r = await http.get(
        url, params={"stuck": "true", "cursor": first["next_cursor"]}, headers=t.auth
    )
    assert r.status_code == 400  # the cursor is bound to its filters


async def test_queue_get_shows_usage_denials_and_stuck_tasks(http, db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    stuck = (await t.submit())["id"]
    await t.submit()
    await make_stuck(db, t, stuck)

    async def deny(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_queue_usage SET denials_quota = 4, denials_rate = 1"
            " WHERE namespace_id = %s AND queue_id = %s",
            (t.namespace_id, t.queue_id),
        )

    await db.transaction(deny)
    r = await http.get(f"/v1/namespaces/{t.namespace}/queues/default", headers=t.auth)
    assert r.status_code == 200
    q = r.json()
    assert q["stuck_after_ms"] == BOUND_MS and q["counts"]["WAITING"] == 2
    usage = q["usage"]
    assert usage["unfinished_tasks"] == 2 and usage["stuck_tasks"] == 1
    assert usage["denials"]["quota"] == 4 and usage["denials"]["rate"] == 1
    assert {"quota", "permits", "rate"} <= set(usage["denials"])
    assert {"reservations", "active_attempts", "window_start", "window_starts"} <= set(usage)


async def test_sdk_lists_stuck_tasks(http, db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    calm = (await t.submit())["id"]
    stuck = (await t.submit())["id"]
    await make_stuck(db, t, stuck)
    client = OrbitClient("http://orbit.test", t.key, namespace=t.namespace, http=http)
    page = await client.tasks.list(stuck=True)
    [task] = page.items
    assert task.id == stuck and task.stuck_at is not None
    assert task.stuck_reason is not None and task.stuck_reason.startswith("WAITING for 10 s")
    assert [x.id for x in (await client.tasks.list(stuck=False)).items] == [calm]
    assert [x.id async for x in client.tasks.iter(stuck=True)] == [stuck]
    assert (await client.tasks.get(calm)).stuck_at is None
