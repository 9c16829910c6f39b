"""``max_subscriptions`` in an application's resources caps its subscriptions over all its
namespaces: a creation past it is 429 ``quota_exceeded`` and writes nothing; updates of
existing subscriptions still pass; a delete frees room; null (the default) is unlimited."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from platform_fixtures import add_key, asgi_client, bearer, make_app, new_tenant

import orbit.http.subscription_delete as sub_delete
import orbit.http.subscriptions as sub_routes
from orbit.storage import Database


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, [*sub_routes.routes(), *sub_delete.routes()])
    async with asgi_client(app) as c:
        yield c


async def test_subscriptions_are_capped_per_application(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)
    res = f"/v1/applications/{t.app_hex}/resources"
    assert (await client.get(res, headers=t.auth)).json()["max_subscriptions"] is None
    r = await client.put(res, json={"max_subscriptions": 2}, headers=t.auth)
    assert r.status_code == 200 and r.json()["max_subscriptions"] == 2, r.text
    r = await client.post(f"/v1/applications/{t.app_hex}/namespaces", json={"name": "other"},
                          headers=t.auth)  # fmt: skip
    assert r.status_code == 201, r.text
    _, key = await add_key(db, t, ["subscriptions.manage"], namespaces=["*"])
    everywhere = bearer(key)

    one = f"/v1/namespaces/{t.namespace}/subscriptions"
    other = "/v1/namespaces/other/subscriptions"
    assert (await client.put(f"{one}/a", json={}, headers=t.auth)).status_code == 201
    assert (await client.put(f"{other}/b", json={}, headers=everywhere)).status_code == 201

    refused = await client.put(f"{one}/c", json={"start": "earliest"}, headers=t.auth)
    assert refused.status_code == 429, refused.text
    err = refused.json()["error"]
    assert err["code"] == "quota_exceeded"
    assert err["details"]["quota"] == "max_subscriptions" and err["details"]["limit"] == 2
    assert refused.headers["Retry-After"]
    assert (await client.get(f"{one}/c", headers=t.auth)).status_code == 404

    # An update is not a creation.
    r = await client.put(f"{one}/a", json={"max_in_flight": 7}, headers=t.auth)
    assert r.status_code == 200, r.text
    # A delete frees room; null lifts the cap.
    assert (await client.delete(f"{other}/b", headers=everywhere)).status_code in (200, 204)
    assert (await client.put(f"{one}/c", json={}, headers=t.auth)).status_code == 201
    assert (await client.put(f"{one}/d", json={}, headers=t.auth)).status_code == 429
    await client.put(res, json={"max_subscriptions": None}, headers=t.auth)
    assert (await client.put(f"{one}/d", json={}, headers=t.auth)).status_code == 201


async def test_the_cap_is_per_application(client: httpx.AsyncClient, db: Database) -> None:
    capped, free = await new_tenant(db), await new_tenant(db)
    r = await client.put(f"/v1/applications/{capped.app_hex}/resources",
                         json={"max_subscriptions": 0}, headers=capped.auth)  # fmt: skip
    assert r.status_code == 200, r.text
    r = await client.put(f"/v1/namespaces/{capped.namespace}/subscriptions/s", json={},
                         headers=capped.auth)  # fmt: skip
    assert r.status_code == 429
    r = await client.put(f"/v1/namespaces/{free.namespace}/subscriptions/s", json={},
                         headers=free.auth)  # fmt: skip
    assert r.status_code == 201
