"""The platform HTTP app end to end (httpx ASGITransport + MariaDB): Idempotency-Key,
ETag/If-Match on resources, malformed bodies, the events route, ops endpoints, readiness."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pymysql
import pytest
from platform_fixtures import asgi_client, bearer, make_app, new_tenant, raw_query, unique

from orbit import events, migrate
from orbit.events import ResultSnapshot
from orbit.ids import new_id
from orbit.storage import DSN, Database, Tx

LIMIT = 4096  # a small body limit for the oversize tests


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, max_body_bytes=LIMIT, idempotency_retention_s=3600)) as c:
        yield c


def app_count(dsn: DSN, name: str) -> int:
    return int(
        raw_query(dsn, "SELECT COUNT(*) FROM orbit_applications WHERE name = %s", (name,))[0][0]
    )  # type: ignore[call-overload]


# --- Idempotency-Key ---------------------------------------------------------------------------


async def test_idempotent_create_replays_and_rejects_other_bodies(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    g = await new_tenant(db, global_admin=True)
    name = unique()
    h = {**g.auth, "Idempotency-Key": f"create-{name}"}
    first = await client.post("/v1/applications", json={"name": name}, headers=h)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    # Same body, other key order and spacing: the original answer, marked as a replay.
    again = await client.post("/v1/applications", content=f'{{ "name" : "{name}" }}', headers=h)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    other = await client.post("/v1/applications", json={"name": name + "x"}, headers=h)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_mismatch"
    assert app_count(dsn, name) == 1 and app_count(dsn, name + "x") == 0
    window = raw_query(
        dsn,
        "SELECT TIMESTAMPDIFF(SECOND, created_at, expires_at) FROM orbit_idempotency_keys WHERE idem_key = %s",
        (f"create-{name}",),
    )
    assert window == [(3600,)]  # the retention setting of the app
    bad = await client.post(
        "/v1/applications", json={"name": unique()}, headers={**g.auth, "Idempotency-Key": ""}
    )
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "Idempotency-Key"


async def test_credential_replay_never_repeats_the_secret(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    t = await new_tenant(db)
    h = {**t.auth, "Idempotency-Key": "cred-1"}
    body = {"name": "ci", "namespaces": [t.namespace], "actions": ["tasks.read"]}
    first = await client.post(f"/v1/applications/{t.app_hex}/credentials", json=body, headers=h)
    assert first.status_code == 201 and first.json()["key"].startswith("orb_")
    again = await client.post(f"/v1/applications/{t.app_hex}/credentials", json=body, headers=h)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["key"] is None and again.json()["key_redacted"] is True
    stored = raw_query(
        dsn,
        "SELECT response_body FROM orbit_idempotency_keys WHERE idem_key = 'cred-1' AND scope = %s",
        (t.app_hex,),
    )
    assert first.json()["key"] not in str(stored)
    ok = await client.get(
        f"/v1/namespaces/{t.namespace}/events", headers=bearer(first.json()["key"])
    )
    assert ok.status_code == 403  # authenticates (tasks.read only), so not 401
    assert (
        raw_query(
            dsn,
            "SELECT COUNT(*) FROM orbit_credentials WHERE application_id = %s",
            (t.application_id,),
        )[0][0]
        == 2
    )


async def test_concurrent_same_key_http_requests_make_one_application(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    g = await new_tenant(db, global_admin=True)
    name = unique()
    h = {**g.auth, "Idempotency-Key": f"race-{name}"}
    replies = await asyncio.gather(
        *(client.post("/v1/applications", json={"name": name}, headers=h) for _ in range(6))
    )
    assert {r.status_code for r in replies} == {201}
    assert len({r.content for r in replies}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in replies) == 5
    assert app_count(dsn, name) == 1


# --- ETag / If-Match on resources ------------------------------------------------------------


async def test_resources_etag_if_match(client: httpx.AsyncClient, db: Database, dsn: DSN) -> None:
    t = await new_tenant(db)
    url = f"/v1/applications/{t.app_hex}/resources"
    got = await client.get(url, headers=t.auth)
    assert got.status_code == 200 and got.headers["etag"] == '"1"'
    assert got.json()["usage"] == {
        "unfinished_tasks": 0,
        "active_attempts": 0,
        "reservations": 0,
        "window_start": None,
        "window_starts": 0,
    }
    put = await client.put(
        url,
        json={"max_active_attempts": 5, "max_starts_per_second": 10},
        headers={**t.auth, "If-Match": '"1"'},
    )
    assert put.status_code == 200 and put.headers["etag"] == '"2"'
    assert put.json()["max_active_attempts"] == 5 and put.json()["max_unfinished_tasks"] is None
    stale = await client.put(
        url, json={"max_active_attempts": 1}, headers={**t.auth, "If-Match": '"1"'}
    )
    assert stale.status_code == 412 and stale.json()["error"]["code"] == "precondition_failed"
    weak = await client.put(
        url, json={"max_active_attempts": 1}, headers={**t.auth, "If-Match": 'W/"2"'}
    )
    assert weak.status_code == 412
    create_only = await client.put(
        url, json={"max_active_attempts": 1}, headers={**t.auth, "If-None-Match": "*"}
    )
    assert create_only.status_code == 412
    assert (await client.get(url, headers=t.auth)).json()["max_active_attempts"] == 5
    # A no-op keeps the revision; null means unlimited; omitted fields are unchanged.
    noop = await client.put(url, json={"max_active_attempts": 5}, headers=t.auth)
    assert noop.status_code == 200 and noop.headers["etag"] == '"2"'
    cleared = await client.put(
        url, json={"max_active_attempts": None}, headers={**t.auth, "If-Match": '"2"'}
    )
    assert cleared.headers["etag"] == '"3"' and cleared.json()["max_active_attempts"] is None
    assert cleared.json()["max_starts_per_second"] == 10
    assert (await client.get(url, headers={**t.auth, "If-None-Match": '"3"'})).status_code == 304
    # Usage changes (Pulse's counters) never bump the config revision.
    raw_query(
        dsn,
        "UPDATE orbit_application_resources SET unfinished_tasks = 7 WHERE application_id = %s",
        (t.application_id,),
    )
    after = await client.get(url, headers=t.auth)
    assert after.headers["etag"] == '"3"' and after.json()["usage"]["unfinished_tasks"] == 7


# --- malformed bodies ----------------------------------------------------------------------


def nested(depth: int) -> str:
    """A body whose nesting is exactly ``depth`` levels (the body object is level 1)."""
    return '{"name": "NAME", "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ('{"name": ', 400, None),
        ("[1, 2]", 400, None),
        ("", 400, None),
        ('{"name": 5}', 400, "name"),
        ('{"name": "has space"}', 400, "name"),
        ('{"name": "NAME", "extra": true}', 400, "extra"),
        (nested(33), 400, None),
        ('{"name": "NAME", "pad": "' + "x" * LIMIT + '"}', 413, None),
    ],
    ids=[
        "bad-json",
        "array",
        "empty",
        "wrong-type",
        "bad-name",
        "unknown-field",
        "too-deep",
        "oversize",
    ],
)
async def test_malformed_bodies_write_nothing(
    client: httpx.AsyncClient, db: Database, dsn: DSN, body: str, status: int, field: str | None
) -> None:
    g = await new_tenant(db, global_admin=True)
    name = unique()
    r = await client.post(
        "/v1/applications",
        content=body.replace("NAME", name),
        headers={**g.auth, "Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == ("invalid_request" if status == 400 else "payload_too_large")
    assert err["details"].get("field") == field
    assert app_count(dsn, name) == 0


async def test_depth_limit_is_inclusive_and_counts_the_body(
    client: httpx.AsyncClient, db: Database
) -> None:
    g = await new_tenant(db, global_admin=True)
    # 32 levels is accepted by the depth check (then rejected only as an unknown field "x").
    r = await client.post(
        "/v1/applications", content=nested(32).replace("NAME", unique()), headers=g.auth
    )
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "x"


async def test_chunked_oversize_body_is_413(
    client: httpx.AsyncClient, db: Database, dsn: DSN
) -> None:
    g = await new_tenant(db, global_admin=True)
    name = unique()

    async def chunks() -> AsyncIterator[bytes]:
        yield f'{{"name": "{name}", "pad": "'.encode()
        for _ in range(LIMIT // 512 + 2):
            yield b"x" * 512
        yield b'"}'

    r = await client.post("/v1/applications", content=chunks(), headers=g.auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert app_count(dsn, name) == 0


# --- events route ----------------------------------------------------------------------------


async def test_events_route_pages_by_sequence(client: httpx.AsyncClient, db: Database) -> None:
    t = await new_tenant(db)

    async def write(tx: Tx) -> list[int]:
        return await events.append_result_events(
            tx, t.namespace_id,
            [ResultSnapshot(task_id=new_id(), queue="q", kind="k", owner_id=t.application_id, state="SUCCEEDED", result='{"n": 1.0}') for _ in range(3)],
        )  # fmt: skip

    assert await db.transaction(write) == [1, 2, 3]
    url = f"/v1/namespaces/{t.namespace}/events"
    page = (await client.get(url, params={"limit": 2}, headers=t.auth)).json()
    assert [e["seq"] for e in page["items"]] == [1, 2] and page["next_cursor"]
    assert (
        b'"result":{"n": 1.0}'
        in (await client.get(url, params={"limit": 1}, headers=t.auth)).content
    )
    rest = (await client.get(url, params={"cursor": page["next_cursor"]}, headers=t.auth)).json()
    assert [e["seq"] for e in rest["items"]] == [3] and rest["next_cursor"] is None
    assert (await client.get(url, params={"after_seq": 3}, headers=t.auth)).json() == {
        "items": [],
        "next_cursor": None,
        "next_after_seq": 3,
    }
    bad = await client.get(url, params={"limit": 501}, headers=t.auth)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "limit"


# --- ops endpoints -----------------------------------------------------------------------------


async def test_open_endpoints_need_no_key(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json()["status"] == "ok"
    assert (await client.get("/readyz")).json()["status"] == "ready"
    assert (await client.get("/metrics")).status_code == 200
    assert (await client.get("/openapi.json")).status_code == 200
    assert (await client.get("/v1/whoami")).status_code == 401


async def test_unknown_route_and_method_use_the_error_shape(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.patch("/v1/applications")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


async def test_openapi_is_generated_from_routes_and_types(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    post = doc["paths"]["/v1/applications/{app_id}/credentials"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CredentialCreate"
    }
    assert "201" in post["responses"] and "401" in post["responses"]
    assert any(p["name"] == "Idempotency-Key" for p in post["parameters"])
    assert {"ApplicationOut", "ResourcesPut", "ErrorBody", "CredentialOut"} <= set(
        doc["components"]["schemas"]
    )
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert "/v1/namespaces/{ns}/events" in doc["paths"]


async def test_metrics_count_requests_conflicts_and_pool(
    client: httpx.AsyncClient, db: Database
) -> None:
    t = await new_tenant(db)
    url = f"/v1/applications/{t.app_hex}/resources"
    await client.put(url, json={"max_active_attempts": 1}, headers={**t.auth, "If-Match": '"42"'})
    text = (await client.get("/metrics")).text
    assert 'orbit_conflicts_total{kind="precondition_failed"}' in text
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(
            'orbit_http_requests_total{route="/v1/applications/{app_id}/resources",method="PUT",status="412"}'
        )
    )
    assert float(line.split()[-1]) >= 1
    assert "orbit_db_pool_connections{state=" in text and "orbit_db_commits_total" in text


# --- readiness ---------------------------------------------------------------------------------


@pytest.fixture
def migrated_empty(empty_db: DSN) -> Iterator[DSN]:
    migrate.up(empty_db)
    yield empty_db


async def test_readiness_refuses_a_foreign_key_and_pending_migrations(
    migrated_empty: DSN, empty_db: DSN
) -> None:
    database = await Database.connect(migrated_empty, maxsize=2)
    try:
        async with asgi_client(make_app(database)) as c:
            assert (await c.get("/readyz")).status_code == 200
            conn = pymysql.connect(autocommit=True, **migrated_empty.connect_kwargs())
            try:
                with conn.cursor() as cur:
                    cur.execute("CREATE TABLE fk_parent (id INT PRIMARY KEY) ENGINE=InnoDB")
                    cur.execute(
                        "CREATE TABLE fk_child (pid INT, CONSTRAINT fk_bad FOREIGN KEY (pid) REFERENCES fk_parent (id)) ENGINE=InnoDB"
                    )
            finally:
                conn.close()
            await asyncio.sleep(1.05)  # past the readiness cache
            r = await c.get("/readyz")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            err = r.json()["error"]
            assert err["code"] == "not_ready" and any(
                "foreign key" in p for p in err["details"]["problems"]
            )
    finally:
        await database.close()


async def test_readiness_refuses_an_unmigrated_database(empty_db: DSN) -> None:
    database = await Database.connect(empty_db, maxsize=2)
    try:
        async with asgi_client(make_app(database)) as c:
            r = await c.get("/readyz")
            assert r.status_code == 503
            assert any("pending" in p for p in r.json()["error"]["details"]["problems"])
    finally:
        await database.close()


def test_nested_helper() -> None:
    assert json.loads(nested(3).replace("NAME", "n")) == {"name": "n", "x": [[]]}
