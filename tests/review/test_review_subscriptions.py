"""Review: a delivery-history cursor that is well formed but holds a non-integer position is
a 400 ``invalid_request`` (like every other list), never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from platform_fixtures import make_app
from subscription_fixtures import make_tenant

from orbit.http import subscriptions as sub_routes
from orbit.pagination import encode_cursor
from orbit.storage import Database


@pytest.fixture
async def http(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, sub_routes.routes())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://orbit.test") as client:
        yield client


@pytest.mark.parametrize("seq", ["x", -1, 1.5, None])
async def test_history_cursor_with_a_bad_position_is_400(
    http: httpx.AsyncClient, db: Database, seq: object
) -> None:
    t = await make_tenant(db)
    url = f"/v1/namespaces/{t.namespace}/subscriptions/s1"
    assert (await http.put(url, json={"start": "earliest"}, headers=t.auth)).status_code == 201
    cursor = encode_cursor({"seq": seq}, {"subscription": "s1", "state": None})
    r = await http.get(f"{url}/deliveries", params={"cursor": cursor}, headers=t.auth)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"]["field"] == "cursor"
