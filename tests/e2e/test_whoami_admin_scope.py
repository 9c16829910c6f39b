"""``GET /v1/whoami`` says what ``admin`` reaches: an ``admin`` key listing one namespace
administers its whole application (it creates keys for every namespace), and whoami shows
``admin_scope: "application"``; a key without ``admin`` shows null."""

from __future__ import annotations

from platform_fixtures import add_key, asgi_client, bearer, make_app, new_tenant

from orbit.ids import id_hex
from orbit.storage import Database


async def test_whoami_shows_that_admin_is_application_wide(db: Database) -> None:
    async with asgi_client(make_app(db)) as client:
        t = await new_tenant(db)
        _, key = await add_key(db, t, ["admin"], namespaces=[id_hex(t.namespace_id)])
        me = (await client.get("/v1/whoami", headers=bearer(key))).json()
        assert me["namespaces"] == [t.namespace] and me["admin_scope"] == "application"
        # As documented: the namespace list does not limit administration.
        r = await client.post(f"/v1/applications/{t.app_hex}/credentials", headers=bearer(key),
                              json={"name": "all", "namespaces": ["*"], "actions": ["tasks.read"]})  # fmt: skip
        assert r.status_code == 201, r.text
        reader = (await client.get("/v1/whoami", headers=bearer(r.json()["key"]))).json()
        assert reader["admin_scope"] is None
        g = await new_tenant(db, global_admin=True)
        assert (await client.get("/v1/whoami", headers=g.auth)).json()["admin_scope"] == (
            "all_applications"
        )
