"""``PUT/GET /v1/namespaces/{ns}/retention`` end to end (httpx over ASGI, real database): the
defaults, a replacement with its ETag and If-Match (412), 400 naming the field and changing
nothing, the ``admin`` action (403), a queue-limited key (403), the audit record, and
tenant isolation (another tenant's key gets the same 404 as an absent namespace)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from platform_fixtures import PTenant, add_key, asgi_client, bearer, make_app, raw_query
from pulse_fixtures import Tenant

from orbit.http import retention as retention_routes
from orbit.storage import DSN, Database


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, retention_routes.routes())) as c:
        yield c


def ptenant(t: Tenant) -> PTenant:
    return PTenant(
        t.application_id, t.application, t.namespace_id, t.namespace, t.credential_id, t.key
    )


def url(t: Tenant) -> str:
    return f"/v1/namespaces/{t.namespace}/retention"


SETTINGS = {"finished_tasks_days": 30, "events_days": 14, "audit_days": 365,
            "idempotency_hours": 48}  # fmt: skip


async def test_defaults_then_replace_with_etag(
    client: httpx.AsyncClient, tenant: Any, dsn: DSN
) -> None:
    t = await tenant()
    r = await client.get(url(t), headers=t.auth)
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == '"1"'
    assert r.json() == {
        "finished_tasks_days": None, "events_days": None, "audit_days": None,
        "idempotency_hours": None, "revision": 1, "purged_total": 0, "last_run_at": None,
    }  # fmt: skip
    r = await client.put(url(t), json=SETTINGS, headers={**t.auth, "If-Match": '"1"'})
    assert r.status_code == 200, r.text
    assert r.headers["etag"] == '"2"'
    assert {k: r.json()[k] for k in SETTINGS} == SETTINGS
    stale = await client.put(url(t), json={}, headers={**t.auth, "If-Match": '"1"'})
    assert stale.status_code == 412
    again = await client.get(url(t), headers=t.auth)
    assert {k: again.json()[k] for k in SETTINGS} == SETTINGS
    # An empty body: every window unset (kept forever), the default key window.
    cleared = await client.put(url(t), json={}, headers=t.auth)
    assert cleared.status_code == 200 and cleared.json()["events_days"] is None
    assert cleared.headers["etag"] == '"3"'
    audited = raw_query(
        dsn, "SELECT COUNT(*) FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action = 'retention.put' AND outcome = 'ok'", (t.namespace_id,),
    )  # fmt: skip
    assert audited[0][0] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events_days": 0}, "events_days"),
        ({"finished_tasks_days": "7"}, "finished_tasks_days"),
        ({"events_days": 30, "audit_days": 6}, "audit_days"),
        ({"events_days": 30, "audit_days": 10}, "audit_days"),
        ({"audit_days": 30}, "audit_days"),
        ({"idempotency_hours": 721}, "idempotency_hours"),
        ({"purge": True}, "purge"),
    ],
)
async def test_bad_settings_are_400_naming_the_field(
    client: httpx.AsyncClient, tenant: Any, body: dict[str, Any], field: str
) -> None:
    t = await tenant()
    r = await client.put(url(t), json=body, headers=t.auth)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["details"].get("field") == field, err
    assert (await client.get(url(t), headers=t.auth)).headers["etag"] == '"1"'


async def test_actions_limited_keys_and_tenant_isolation(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    other = await tenant()
    _, reader = await add_key(db, ptenant(t), ["tasks.read"])
    for method in ("GET", "PUT"):
        r = await client.request(method, url(t), json={}, headers=bearer(reader))
        assert r.status_code == 403, r.text
    _, limited = await add_key(db, ptenant(t), ["admin"], queues=["default"])
    assert (await client.get(url(t), headers=bearer(limited))).status_code == 403
    absent = await client.get("/v1/namespaces/no-such-ns/retention", headers=other.auth)
    for method in ("GET", "PUT"):
        theirs = await client.request(method, url(t), json=SETTINGS, headers=other.auth)
        assert theirs.status_code == 404, theirs.text
        assert theirs.json() == absent.json()
    assert (await client.get(url(t), headers=t.auth)).json()["events_days"] is None
