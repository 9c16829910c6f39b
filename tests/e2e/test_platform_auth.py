"""Authentication and authorization over HTTP (httpx ASGITransport on the real app + MariaDB):
401 cases, the action matrix, queue and namespace restrictions, admin scopes, revocation and
expiry taking effect on the next request, audited denials, cross-tenant isolation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from platform_fixtures import add_key, asgi_client, bearer, make_app, new_tenant, raw_query, unique
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit.http.auth import authorize
from orbit.http.responses import json_response
from orbit.ids import id_hex, new_id
from orbit.storage import DSN, Database
from orbit.types import ALL_ACTIONS


async def guarded(request: Request) -> Response:
    """A probe route: authorise the path's action on the path's namespace (and ?queue=)."""
    p = await authorize(
        request,
        request.path_params["action"],
        request.path_params["ns"],
        queue=request.query_params.get("queue"),
    )
    return json_response({"namespace_id": id_hex(p.namespace_id or b"")})


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, [Route("/probe/{ns}/{action}", guarded, methods=["GET"])])
    async with asgi_client(app) as c:
        yield c


async def test_unauthenticated_cases_share_one_body(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    t = await new_tenant(db)
    _, revoked = await add_key(db, t, ["tasks.read"])
    revoked_id = revoked.split("_")[1]
    assert (await client.delete(f"/v1/credentials/{revoked_id}", headers=t.auth)).status_code == 200
    other = await new_tenant(db)
    raw_query(
        dsn,
        "UPDATE orbit_applications SET status = 'disabled', revision = revision + 1 WHERE id = %s",
        (other.application_id,),
    )
    wrong_secret = t.key[:-4] + ("AAAA" if not t.key.endswith("AAAA") else "BBBB")
    headers = [
        {},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        bearer("not-a-key"),
        bearer(f"orb_{id_hex(new_id())}_{'x' * 43}"),
        bearer(wrong_secret),
        bearer(revoked),
        other.auth,
    ]
    bodies = set()
    for h in headers:
        r = await client.get(f"/probe/{t.namespace}/tasks.read", headers=h)
        assert r.status_code == 401, h
        bodies.add(r.content)
    assert bodies == {
        b'{"error":{"code":"unauthenticated","message":"missing or invalid API key","details":{}}}'
    }


async def test_expiry_takes_effect_on_the_next_request(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)
    _, key = await add_key(db, t, ["tasks.read"], expires_at=await db.now() + timedelta(seconds=1))
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.read", headers=bearer(key))
    ).status_code == 200
    await asyncio.sleep(1.1)
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.read", headers=bearer(key))
    ).status_code == 401


async def test_revocation_takes_effect_on_the_next_request(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)
    cred_id, key = await add_key(db, t, ["tasks.read", "admin"])
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.read", headers=bearer(key))
    ).status_code == 200
    # The key revokes itself; its very next request is refused.
    r = await client.delete(f"/v1/credentials/{id_hex(cred_id)}", headers=bearer(key))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.read", headers=bearer(key))
    ).status_code == 401
    # Revoking again (with another admin key) is a 200 no-op that keeps the first revocation.
    again = await client.delete(f"/v1/credentials/{id_hex(cred_id)}", headers=t.auth)
    assert again.status_code == 200 and again.json()["revoked_at"] == r.json()["revoked_at"]
    assert again.json()["revision"] == r.json()["revision"]


async def test_action_matrix(client: httpx.AsyncClient, db: Database, dsn: DSN) -> None:
    """A key holding exactly one action passes that action's check and gets 403 for every
    other; every 403 is audited as a denial."""
    t = await new_tenant(db)
    for held in ALL_ACTIONS:
        cred_id, key = await add_key(db, t, [held])
        for wanted in ALL_ACTIONS:
            r = await client.get(f"/probe/{t.namespace}/{wanted}", headers=bearer(key))
            assert r.status_code == (200 if held == wanted else 403), (held, wanted)
            if r.status_code == 403:
                assert r.json()["error"]["code"] == "forbidden"
        denied = raw_query(
            dsn,
            "SELECT action, outcome, status_code, namespace_id FROM orbit_audit_events WHERE credential_id = %s",
            (cred_id,),
        )
        assert sorted(row[0] for row in denied) == sorted(a for a in ALL_ACTIONS if a != held)
        assert {(row[1], row[2], row[3]) for row in denied} == {("denied", 403, t.namespace_id)}


async def test_queue_restriction(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    _, key = await add_key(db, t, ["tasks.submit"], queues=["emails"])
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.submit?queue=emails", headers=bearer(key))
    ).status_code == 200
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.submit?queue=sms", headers=bearer(key))
    ).status_code == 403
    # The bootstrap key has no queue list: every queue.
    assert (
        await client.get(f"/probe/{t.namespace}/tasks.submit?queue=sms", headers=t.auth)
    ).status_code == 200


async def test_namespace_visibility_is_a_404(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    second = await client.post(
        f"/v1/applications/{t.app_hex}/namespaces", json={"name": "second"}, headers=t.auth
    )
    assert second.status_code == 201
    # The bootstrap key is limited to its own namespace: "second" exists but is invisible.
    hidden = await client.get("/probe/second/tasks.read", headers=t.auth)
    absent = await client.get(f"/probe/{unique('nope')}/tasks.read", headers=t.auth)
    assert hidden.status_code == absent.status_code == 404
    assert hidden.content == absent.content
    _, star = await add_key(db, t, ["tasks.read"], namespaces=["*"])
    assert (await client.get("/probe/second/tasks.read", headers=bearer(star))).json() == {
        "namespace_id": second.json()["id"]
    }
    # A key without the action learns nothing about namespaces: 403 either way.
    _, other_action = await add_key(db, t, ["tasks.submit"])
    assert (
        await client.get(f"/probe/{unique('x')}/tasks.read", headers=bearer(other_action))
    ).status_code == 403


async def test_admin_scopes(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)
    _, no_admin = await add_key(db, t, [a for a in ALL_ACTIONS if a != "admin"])
    for method, path, body in [
        ("POST", f"/v1/applications/{t.app_hex}/namespaces", {"name": "n"}),
        ("GET", f"/v1/applications/{t.app_hex}/namespaces", None),
        (
            "POST",
            f"/v1/applications/{t.app_hex}/credentials",
            {"name": "k", "namespaces": ["*"], "actions": ["tasks.read"]},
        ),
        ("GET", f"/v1/applications/{t.app_hex}/resources", None),
        ("PUT", f"/v1/applications/{t.app_hex}/resources", {}),
        ("GET", "/v1/applications", None),
        ("POST", "/v1/applications", {"name": unique()}),
    ]:
        r = await client.request(method, path, json=body, headers=bearer(no_admin))
        assert r.status_code == 403, (method, path)
    # An application admin may not create applications or grant global admin.
    assert (
        await client.post("/v1/applications", json={"name": unique()}, headers=t.auth)
    ).status_code == 403
    r = await client.post(
        f"/v1/applications/{t.app_hex}/credentials",
        json={"name": "g", "namespaces": ["*"], "actions": ["admin"], "global_admin": True},
        headers=t.auth,
    )
    assert r.status_code == 403
    # A global admin may do both, for any application.
    g = await new_tenant(db, global_admin=True)
    created = await client.post("/v1/applications", json={"name": unique()}, headers=g.auth)
    assert created.status_code == 201
    r = await client.post(
        f"/v1/applications/{created.json()['id']}/namespaces", json={"name": "n"}, headers=g.auth
    )
    assert r.status_code == 201
    listed = await client.get("/v1/applications", headers=t.auth)
    assert [a["id"] for a in listed.json()["items"]] == [t.app_hex]


async def test_cross_tenant_isolation(client: httpx.AsyncClient, db: Database, dsn: DSN) -> None:
    """Every read and write route of tenant A, called with tenant B's admin key, answers
    exactly the 404 of a random id, and changes nothing."""
    a, b = await new_tenant(db), await new_tenant(db)
    a_cred, a_key = await add_key(db, a, ["tasks.read", "events.read"])
    a_ns = unique("only-a")
    assert (
        await client.post(
            f"/v1/applications/{a.app_hex}/namespaces", json={"name": a_ns}, headers=a.auth
        )
    ).status_code == 201
    rnd = id_hex(new_id())
    routes = [
        ("GET", "/v1/applications/{app}", None),
        ("POST", "/v1/applications/{app}/namespaces", {"name": "stolen"}),
        ("GET", "/v1/applications/{app}/namespaces", None),
        (
            "POST",
            "/v1/applications/{app}/credentials",
            {"name": "x", "namespaces": ["*"], "actions": ["admin"]},
        ),
        ("GET", "/v1/applications/{app}/credentials", None),
        ("GET", "/v1/applications/{app}/resources", None),
        ("PUT", "/v1/applications/{app}/resources", {"max_active_attempts": 0}),
        ("DELETE", "/v1/credentials/{cred}", None),
        ("GET", "/v1/namespaces/{ns}/events", None),
        ("GET", "/probe/{ns}/tasks.read", None),
    ]
    for method, template, body in routes:
        theirs = template.format(app=a.app_hex, cred=id_hex(a_cred), ns=a_ns)
        random_ = template.format(app=rnd, cred=rnd, ns=unique("random"))
        r1 = await client.request(method, theirs, json=body, headers=b.auth)
        r2 = await client.request(method, random_, json=body, headers=b.auth)
        assert r1.status_code == r2.status_code == 404, (method, template)
        assert r1.content == r2.content, (method, template)
        assert r1.json()["error"]["details"] == {}
    # Nothing of A changed: its key works, its quotas and namespaces are as they were.
    assert (
        await client.get(f"/probe/{a.namespace}/tasks.read", headers=bearer(a_key))
    ).status_code == 200
    res = await client.get(f"/v1/applications/{a.app_hex}/resources", headers=a.auth)
    assert res.json()["revision"] == 1 and res.json()["max_active_attempts"] is None
    names = {
        n["name"]
        for n in (
            await client.get(f"/v1/applications/{a.app_hex}/namespaces", headers=a.auth)
        ).json()["items"]
    }
    assert names == {"default", a_ns}
    assert (
        raw_query(
            dsn,
            "SELECT COUNT(*) FROM orbit_credentials WHERE application_id = %s",
            (a.application_id,),
        )[0][0]
        == 2
    )


async def test_denials_and_conflicts_are_audited_with_request_id(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    t = await new_tenant(db)
    ok = await client.post(
        f"/v1/applications/{t.app_hex}/namespaces",
        json={"name": "dup"},
        headers={**t.auth, "X-Request-Id": "req-create-1"},
    )
    assert ok.status_code == 201 and ok.headers["x-request-id"] == "req-create-1"
    dup = await client.post(
        f"/v1/applications/{t.app_hex}/namespaces",
        json={"name": "dup"},
        headers={**t.auth, "X-Request-Id": "req-create-2"},
    )
    assert dup.status_code == 409
    stale = await client.put(
        f"/v1/applications/{t.app_hex}/resources",
        json={"max_reservations": 1},
        headers={**t.auth, "If-Match": '"99"', "X-Request-Id": "req-put-1"},
    )
    assert stale.status_code == 412
    rows = raw_query(
        dsn,
        "SELECT request_id, action, outcome, status_code, credential_id, application_id FROM orbit_audit_events"
        " WHERE request_id IN ('req-create-1', 'req-create-2', 'req-put-1') AND application_id = %s ORDER BY request_id",
        (t.application_id,),
    )
    assert [r[:4] for r in rows] == [
        ("req-create-1", "namespaces.create", "ok", 201),
        ("req-create-2", "namespaces.create", "conflict", 409),
        ("req-put-1", "resources.update", "conflict", 412),
    ]
    assert {(bytes(r[4]), bytes(r[5])) for r in rows} == {(t.credential_id, t.application_id)}
    # A generated request id is 32 hex; a malformed incoming one is replaced.
    assert (
        len(
            (await client.get("/healthz", headers={"X-Request-Id": "bad id!"})).headers[
                "x-request-id"
            ]
        )
        == 32
    )


async def test_bootstrap_tenants_manage_only_their_own_namespaces(
    client: httpx.AsyncClient, db: Database
) -> None:
    a, b = await new_tenant(db), await new_tenant(db)
    for me, other in ((a, b), (b, a)):
        mine = await client.post(
            f"/v1/applications/{me.app_hex}/namespaces", json={"name": "extra"}, headers=me.auth
        )
        assert mine.status_code == 201
        theirs = await client.post(
            f"/v1/applications/{other.app_hex}/namespaces", json={"name": "x2"}, headers=me.auth
        )
        assert theirs.status_code == 404
