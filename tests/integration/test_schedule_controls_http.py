"""Schedule control routes end to end (httpx over ASGI, real database, database clock):
trigger (201, key → 200, Idempotency-Key replay), backfill (202 with the count), delete
(204, history kept), the action each needs, queue-limited keys, tenant isolation, audit,
and the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from platform_fixtures import PTenant, add_key, bearer, make_app, pulse_routes, raw_query
from pulse_fixtures import Tenant
from schedule_support import (  # noqa: F401 - sched_dsn_fixture, sdb_fixture: fixtures
    quiesce,
    sched_dsn_fixture,
    sdb_fixture,
    tenant,
)

from orbit.storage import DSN, Database


@pytest.fixture
async def http(sdb: Database, sched_dsn: DSN) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(sdb, pulse_routes)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://orbit.test"
    ) as client:
        yield client
    quiesce(sched_dsn)


def url(t: Tenant, name: str = "hourly") -> str:
    return f"/v1/namespaces/{t.namespace}/schedules/{name}"


BODY = {"queue": "default", "every_ms": 3_600_000, "task": {"kind": "report", "payload": {"a": 1}}}


def ptenant(t: Tenant) -> PTenant:
    return PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_trigger_over_http(http: httpx.AsyncClient, sdb: Database, sched_dsn: DSN) -> None:
    t = await tenant(sdb)
    assert (await http.put(url(t), json=BODY, headers=t.auth)).status_code == 201
    r = await http.post(f"{url(t)}/trigger", headers=t.auth)  # empty body
    assert r.status_code == 201, r.text
    occ, task = r.json()["occurrence"], r.json()["task"]
    assert occ["origin"] == "trigger" and task["id"] == occ["task_id"]
    assert task["source"] == {"kind": "schedule", "id": occ["id"]}
    r = await http.post(f"{url(t)}/trigger", json={"idempotency_key": "deploy-7"}, headers=t.auth)
    assert r.status_code == 201
    keyed = r.json()["occurrence"]["id"]
    r = await http.post(f"{url(t)}/trigger", json={"idempotency_key": "deploy-7"}, headers=t.auth)
    assert r.status_code == 200 and r.json()["occurrence"]["id"] == keyed
    h = {**t.auth, "Idempotency-Key": "hdr-1"}
    first = await http.post(f"{url(t)}/trigger", headers=h)
    replay = await http.post(f"{url(t)}/trigger", headers=h)
    assert first.status_code == replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.content == first.content
    r = await http.get(f"{url(t)}/occurrences", headers=t.auth)
    assert [i["origin"] for i in r.json()["items"]] == ["trigger"] * 3
    bad = await http.post(f"{url(t)}/trigger", json={"idempotency_key": ""}, headers=t.auth)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "idempotency_key"
    bad = await http.post(f"{url(t)}/trigger", json={"key": "x"}, headers=t.auth)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "key"
    audited = raw_query(
        sched_dsn,
        "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action = 'schedules.trigger' AND outcome = 'ok'",
        (t.namespace_id,),
    )
    assert audited == [(3,)]


async def test_backfill_and_delete_over_http(http: httpx.AsyncClient, sdb: Database) -> None:
    t = await tenant(sdb)
    now = datetime.now(UTC).replace(tzinfo=None)  # before the PUT: covered_until >= now
    assert (await http.put(url(t), json=BODY, headers=t.auth)).status_code == 201
    span = {"from": rfc(now - timedelta(hours=5)), "to": rfc(now)}  # five whole hours
    r = await http.post(f"{url(t)}/backfill", json=span, headers=t.auth)
    assert r.status_code == 202, r.text
    assert r.json()["count"] == 5 and r.json()["already_occurred"] == 0
    r = await http.post(f"{url(t)}/backfill", json=span, headers=t.auth)
    assert r.status_code == 202 and r.json()["count"] == 0 and r.json()["already_occurred"] == 5
    r = await http.post(f"{url(t)}/backfill", json={"from": span["from"]}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "to"
    r = await http.post(f"{url(t)}/backfill", json={**span, "to": "soon"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "to"
    tasks = await http.get(f"/v1/namespaces/{t.namespace}/tasks", headers=t.auth)
    assert len(tasks.json()["items"]) == 5
    r = await http.delete(url(t), headers={**t.auth, "If-Match": '"9"'})
    assert r.status_code == 412
    r = await http.delete(url(t), headers=t.auth)
    assert r.status_code == 204 and r.content == b""
    assert (await http.get(url(t), headers=t.auth)).status_code == 404
    assert (await http.delete(url(t), headers=t.auth)).status_code == 404
    assert (await http.post(f"{url(t)}/trigger", headers=t.auth)).status_code == 404
    # the tasks it created stay
    tasks = await http.get(f"/v1/namespaces/{t.namespace}/tasks", headers=t.auth)
    assert len(tasks.json()["items"]) == 5


async def test_actions_queue_limits_and_isolation(http: httpx.AsyncClient, sdb: Database) -> None:
    t = await tenant(sdb)
    assert (await http.put(url(t), json=BODY, headers=t.auth)).status_code == 201
    now = datetime.now(UTC).replace(tzinfo=None)
    span = {"from": rfc(now - timedelta(hours=2)), "to": rfc(now)}
    _, reader = await add_key(sdb, ptenant(t), ["tasks.read"])
    for method, suffix, body in (
        ("POST", "/trigger", None), ("POST", "/backfill", span), ("DELETE", "", None)
    ):  # fmt: skip
        r = await http.request(method, f"{url(t)}{suffix}", json=body, headers=bearer(reader))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert (await http.request(method, f"{url(t)}{suffix}", json=body)).status_code == 401
        # another tenant: the same 404 as a schedule that does not exist
        other = await tenant(sdb)
        theirs = await http.request(method, f"{url(t)}{suffix}", json=body, headers=other.auth)
        absent = await http.request(method, f"{url(other)}{suffix}", json=body, headers=other.auth)
        assert theirs.status_code == absent.status_code == 404
        assert theirs.json()["error"]["code"] == absent.json()["error"]["code"] == "not_found"
    _, manager = await add_key(sdb, ptenant(t), ["schedules.manage"])
    r = await http.post(f"{url(t)}/trigger", headers=bearer(manager))
    assert r.status_code == 201
    # a key limited to queue "default" cannot see a schedule of queue "secret"
    await t.add_queue("secret")
    hidden = {**BODY, "queue": "secret"}
    assert (await http.put(url(t, "hidden"), json=hidden, headers=t.auth)).status_code == 201
    _, limited = await add_key(sdb, ptenant(t), ["schedules.manage"], queues=["default"])
    h = bearer(limited)
    assert (await http.post(f"{url(t, 'hidden')}/trigger", headers=h)).status_code == 404
    assert (await http.post(f"{url(t, 'hidden')}/backfill", json=span, headers=h)).status_code == 404
    assert (await http.delete(url(t, "hidden"), headers=h)).status_code == 404
    assert (await http.post(f"{url(t)}/trigger", headers=h)).status_code == 201


async def test_overlap_over_http_and_openapi(http: httpx.AsyncClient, sdb: Database) -> None:
    t = await tenant(sdb)
    r = await http.put(url(t), json={**BODY, "overlap": "buffer_one"}, headers=t.auth)
    assert r.status_code == 201 and r.json()["overlap"] == "buffer_one"
    r = await http.put(url(t), json={**BODY, "overlap": "sometimes"}, headers=t.auth)
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "overlap"
    r = await http.get(url(t), headers=t.auth)
    assert r.json()["overlap"] == "buffer_one" and r.json()["buffered_fire_at"] is None
    doc = (await http.get("/openapi.json")).json()
    paths = doc["paths"]
    base = "/v1/namespaces/{ns}/schedules/{name}"
    assert "post" in paths[f"{base}/trigger"] and "post" in paths[f"{base}/backfill"]
    assert "delete" in paths[base] and "put" in paths[base]
    assert "202" in paths[f"{base}/backfill"]["post"]["responses"]
