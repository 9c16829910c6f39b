"""List pages carry at most ``max_page_bytes`` of stored JSON: ``GET …/tasks`` and
``GET …/events`` end a page early with a ``next_cursor`` once the budget is reached (always
holding at least one item), and the next pages carry the rest, none lost or repeated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from platform_fixtures import add_key, asgi_client, bearer, make_app, new_tenant, pulse_routes

from orbit import events
from orbit.events import ResultSnapshot
from orbit.ids import new_id
from orbit.storage import Database, Tx

BUDGET = 10_000
BLOB = "x" * 3_000  # a payload or result of ~3 KB: three fit a page, a fourth does not


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, pulse_routes, max_page_bytes=BUDGET)
    async with asgi_client(app) as c:
        yield c


async def _pages(client: httpx.AsyncClient, url: str, auth: dict[str, str]) -> list[list[Any]]:
    pages: list[list[Any]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        r = await client.get(url, params=params, headers=auth)
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append(body["items"])
        if body["next_cursor"] is None:
            return pages
        params = {"limit": 500, "cursor": body["next_cursor"]}


async def test_task_pages_stop_at_the_byte_budget(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    ns = f"/v1/namespaces/{t.namespace}"
    assert (await client.put(f"{ns}/queues/q", json={}, headers=t.auth)).status_code == 201
    ids = []
    for i in range(7):
        r = await client.post(f"{ns}/tasks", headers=t.auth,
                              json={"queue": "q", "kind": "k", "payload": {"i": i, "b": BLOB}})  # fmt: skip
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    small = await client.post(f"{ns}/tasks", json={"queue": "q", "kind": "k", "payload": {}},
                              headers=t.auth)  # fmt: skip
    ids.append(small.json()["id"])

    pages = await _pages(client, f"{ns}/tasks", t.auth)
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [task["id"] for p in pages for task in p] == ids
    # The stuck filter pages the same way.
    stuck = await _pages(client, f"{ns}/tasks?stuck=false", t.auth)
    assert [len(p) for p in stuck] == [3, 3, 2]


async def test_one_item_over_the_budget_still_makes_a_page(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)
    ns = f"/v1/namespaces/{t.namespace}"
    assert (await client.put(f"{ns}/queues/q", json={}, headers=t.auth)).status_code == 201
    for _ in range(2):
        r = await client.post(f"{ns}/tasks", headers=t.auth,
                              json={"queue": "q", "kind": "k", "payload": {"b": BLOB * 4}})  # fmt: skip
        assert r.status_code == 201, r.text
    assert [len(p) for p in await _pages(client, f"{ns}/tasks", t.auth)] == [1, 1]


async def test_event_pages_stop_at_the_byte_budget(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)

    def snap(queue: str) -> ResultSnapshot:
        return ResultSnapshot(task_id=new_id(), queue=queue, kind="k", owner_id=t.application_id,
                              state="SUCCEEDED", result={"b": BLOB})  # fmt: skip

    async def write(tx: Tx) -> list[int]:
        return await events.append_result_events(
            tx, t.namespace_id, [snap("qx" if i % 2 == 0 else "qy") for i in range(8)]
        )

    assert await db.transaction(write) == list(range(1, 9))
    url = f"/v1/namespaces/{t.namespace}/events"
    pages = await _pages(client, url, t.auth)
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [e["seq"] for p in pages for e in p] == list(range(1, 9))
    # A queue-limited key's pages count only the events it sees.
    _, key = await add_key(db, t, ["events.read"], queues=["qx"])
    limited = await _pages(client, url, bearer(key))
    assert [[e["seq"] for e in p] for p in limited] == [[1, 3, 5], [7]]


async def _heavy_pages(db: Database, client: Any) -> tuple[Any, Any, str, list[int]]:
    """Two tenants with a queue each; the heavy one submits three big tasks and reads its task
    page three times: (heavy, light, heavy's namespace path, the three statuses)."""
    heavy, light = await new_tenant(db), await new_tenant(db)
    for t in (heavy, light):
        ns = f"/v1/namespaces/{t.namespace}"
        assert (await client.put(f"{ns}/queues/q", json={}, headers=t.auth)).status_code == 201
    ns = f"/v1/namespaces/{heavy.namespace}"
    for _ in range(3):
        r = await client.post(f"{ns}/tasks", headers=heavy.auth,
                              json={"queue": "q", "kind": "k", "payload": {"b": BLOB}})  # fmt: skip
        assert r.status_code == 201, r.text
    statuses = [(await client.get(f"{ns}/tasks", headers=heavy.auth)).status_code
                for _ in range(3)]  # fmt: skip
    return heavy, light, ns, statuses


async def test_list_bytes_are_budgeted_per_application(db: Database) -> None:
    """A tenant reading big pages in a loop kept the node busy encoding them while every
    other tenant waited; now each application has a budget of list bytes per node (429
    ``rate_limited`` past it, having read nothing), and small pages cost next to nothing."""
    app = make_app(db, pulse_routes, max_page_bytes=BUDGET, list_bytes_per_s=1,
                   list_bytes_burst=20_000)  # fmt: skip
    async with asgi_client(app) as client:
        heavy, light, ns, statuses = await _heavy_pages(db, client)
        assert statuses[:2] == [200, 200] and statuses[2] == 429, statuses
        r = await client.get(f"{ns}/tasks", headers=heavy.auth)
        assert r.json()["error"]["code"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        r = await client.get(f"/v1/namespaces/{heavy.namespace}/events", headers=heavy.auth)
        assert r.status_code == 200  # no result events: an empty page costs nothing
        other = f"/v1/namespaces/{light.namespace}"
        for _ in range(5):
            assert (await client.get(f"{other}/tasks", headers=light.auth)).status_code == 200


async def test_a_refused_list_page_refuses_the_next_ones_before_any_database_work(
    db: Database,
) -> None:
    """A client looping on 429s cost the node an authentication and a sizing query per
    request; after a refusal, the application's next task pages are refused (same 429, the
    Retry-After left) before the key is checked: no transaction at all. Another kind of
    read (event pages) and other applications are not affected."""
    app = make_app(db, pulse_routes, max_page_bytes=BUDGET, list_bytes_per_s=1,
                   list_bytes_burst=20_000)  # fmt: skip
    async with asgi_client(app) as client:
        heavy, light, ns, statuses = await _heavy_pages(db, client)
        assert statuses == [200, 200, 429], statuses
        transactions = db.stats.commits + db.stats.rollbacks
        for limit in (500, 1):  # even a page the budget could pay, inside the window
            r = await client.get(f"{ns}/tasks", params={"limit": limit}, headers=heavy.auth)
            assert r.status_code == 429 and r.json()["error"]["details"]["reason"] == "list_bytes"
            assert int(r.headers["Retry-After"]) >= 1
        assert db.stats.commits + db.stats.rollbacks == transactions  # refused before any
        r = await client.get(f"{ns}/events", headers=heavy.auth)
        assert r.status_code == 200  # another kind of read: its own window
        other = f"/v1/namespaces/{light.namespace}"
        assert (await client.get(f"{other}/tasks", headers=light.auth)).status_code == 200
