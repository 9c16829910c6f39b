"""A task's own retry policy at submit, within its queue's bounds (real database, HTTP over
ASGI): the queue's ``retry_bounds`` round trip, the policy frozen into the task and used for
its next attempt's delay, 400s naming the field and the bound, per item in a batch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from platform_fixtures import asgi_client, make_app, pulse_routes
from pulse_fixtures import Tenant
from pulse_worker_support import connect, open_session, task_row

from orbit.ids import parse_id
from orbit.storage import Database
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub

BOUNDS = {"min_delay_ms": 100, "max_delay_ms": 60_000, "max_multiplier": 3.0}


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, pulse_routes)) as c:
        yield c


async def bounded(client: httpx.AsyncClient, t: Tenant, name: str = "bounded") -> dict[str, Any]:
    r = await client.put(f"/v1/namespaces/{t.namespace}/queues/{name}",
                         json={"retry_bounds": BOUNDS}, headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def tasks_url(t: Tenant) -> str:
    return f"/v1/namespaces/{t.namespace}/tasks"


async def test_bounds_round_trip_and_validation(client: httpx.AsyncClient, tenant: Any) -> None:
    t = await tenant()
    q = await bounded(client, t)
    assert q["retry_bounds"] == BOUNDS and q["revision"] == 1
    url = f"/v1/namespaces/{t.namespace}/queues/bounded"
    same = await client.put(url, json={"retry_bounds": BOUNDS}, headers=t.auth)
    assert same.status_code == 200 and same.json()["revision"] == 1  # unchanged
    none = await client.put(url, json={}, headers=t.auth)
    assert none.json()["revision"] == 2
    assert none.json()["retry_bounds"] == {"min_delay_ms": None, "max_delay_ms": None,
                                           "max_multiplier": None}  # fmt: skip
    r = await client.put(url, json={"retry_bounds": {"min_delay_ms": 10, "max_delay_ms": 5}},
                         headers=t.auth)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "retry_bounds.max_delay_ms"
    r = await client.put(url, json={"retry_bounds": {"max_multiplier": 0.5}}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "retry_bounds.max_multiplier"
    r = await client.put(url, json={"retry_bounds": {"max_delay": 5}}, headers=t.auth)
    assert r.status_code == 400


@pytest.mark.parametrize(
    ("retry", "field", "text"),
    [
        ({"backoff_initial_ms": 50}, "retry.backoff_initial_ms", "at least 100"),
        ({"backoff_max_ms": 70_000}, "retry.backoff_max_ms", "at most 60000"),
        ({"backoff_multiplier": 5}, "retry.backoff_multiplier", "at most 3.0"),
        ({"backoff_initial_ms": 2000, "backoff_max_ms": 1000}, "retry.backoff_max_ms",
         "at least backoff_initial_ms"),
        ({"backoff_multiplier": 0.5}, "retry.backoff_multiplier", ""),
        ({"jitter": True}, "retry.jitter", ""),
    ],
)
async def test_a_policy_outside_the_bounds_is_400_and_writes_nothing(
    client: httpx.AsyncClient, tenant: Any, retry: dict[str, Any], field: str, text: str
) -> None:
    t = await tenant()
    await bounded(client, t)
    body = {"queue": "bounded", "kind": "k", "retry": retry}
    r = await client.post(tasks_url(t), json=body, headers=t.auth)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"]["field"] == field and text in r.json()["error"]["message"]
    listed = await client.get(tasks_url(t), params={"queue": "bounded"}, headers=t.auth)
    assert listed.json()["items"] == []


async def test_the_policy_is_frozen_and_used(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    await bounded(client, t)
    body = {"queue": "bounded", "kind": "k", "max_attempts": 3,
            "retry": {"backoff_initial_ms": 250, "backoff_multiplier": 1.5}}  # fmt: skip
    r = await client.post(tasks_url(t), json=body, headers=t.auth)
    assert r.status_code == 201, r.text
    task = r.json()
    # given fields are the task's, the others the queue's default (300 000 ms cap)
    assert task["retry"] == {"backoff_initial_ms": 250, "backoff_max_ms": 300_000,
                             "backoff_multiplier": 1.5}  # fmt: skip
    plain = await client.post(tasks_url(t), json={"queue": "bounded", "kind": "k"}, headers=t.auth)
    assert plain.json()["retry"]["backoff_initial_ms"] == 1000  # the queue's default
    # a retryable failure waits the task's own delay
    hub = Hub("node-retry-policy")
    info, _ = await open_session(db, t, queues=["bounded"], max_concurrency=1)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    assert offer.task.id == task["id"]
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)
    now = await db.now()
    err = wire.FailError(type="Flaky")
    receipt = await attempts.report(
        db, t.namespace_id, Report("fail", aid, started.execution_token, error=err, retryable=True),
        now=now,
    )  # fmt: skip
    assert receipt.task_state == "WAITING"
    row = await task_row(db, t, task["id"])
    assert row["available_at"] == now + timedelta(milliseconds=250)


async def test_batch_items_are_judged_one_by_one(client: httpx.AsyncClient, tenant: Any) -> None:
    t = await tenant()
    await bounded(client, t)
    items = [
        {"queue": "bounded", "kind": "k", "retry": {"backoff_initial_ms": 500}},
        {"queue": "bounded", "kind": "k", "retry": {"backoff_initial_ms": 5}},
        {"queue": "default", "kind": "k", "retry": {"backoff_initial_ms": 5}},  # unbounded
    ]
    r = await client.post(f"{tasks_url(t)}:batch", json={"tasks": items}, headers=t.auth)
    assert r.status_code == 200, r.text
    out = r.json()["items"]
    assert [i["status"] for i in out] == [201, 400, 201]
    assert out[1]["error"]["details"]["field"] == "retry.backoff_initial_ms"
    assert out[0]["task"]["retry"]["backoff_initial_ms"] == 500
    assert out[2]["task"]["retry"]["backoff_initial_ms"] == 5
