"""Publishing and reading workflow definition versions, over HTTP and through the service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from event_rows import raw_events
from platform_fixtures import (
    PTenant,
    add_key,
    asgi_client,
    bearer,
    make_app,
    new_tenant,
    pulse_weave_routes,
    unique,
)

from orbit.audit import CLI_ACTOR
from orbit.storage import Database, Tx
from weave import definitions
from weave.definition.model import TaskStep


def doc(kind: str = "k", *extra: dict[str, Any]) -> dict[str, Any]:
    return {"steps": [{"id": "a", "type": "task", "queue": "q", "kind": kind}, *extra]}


@pytest.fixture
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, pulse_weave_routes)) as c:
        yield c


@pytest.fixture
async def t(db: Database) -> PTenant:
    return await new_tenant(db, namespace=unique("ns"))


def url(t: PTenant, name: str, suffix: str = "") -> str:
    return f"/v1/namespaces/{t.namespace}/workflows/{name}{suffix}"


async def publish(
    client: httpx.AsyncClient, t: PTenant, name: str, body: Any, **headers: str
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps({"definition": body}).encode()
    return await client.post(
        url(t, name, "/versions"),
        content=content,
        headers={**t.auth, "content-type": "application/json", **headers},
    )


async def test_versions_are_numbered_per_workflow(client: httpx.AsyncClient, t: PTenant) -> None:
    r1 = await publish(client, t, "orders", doc("k1"))
    assert r1.status_code == 201, r1.text
    v1 = r1.json()
    assert (
        v1["name"] == "orders"
        and v1["version"] == 1
        and v1["unchanged"] is False
        and v1["step_count"] == 1
    )
    assert len(v1["workflow_id"]) == 32 and len(v1["digest"]) == 64
    r2 = await publish(client, t, "orders", doc("k2"))
    assert (r2.status_code, r2.json()["version"]) == (201, 2)
    # another workflow starts at 1
    r3 = await publish(client, t, "billing", doc("k2"))
    assert (r3.status_code, r3.json()["version"]) == (201, 1)
    got = await client.get(url(t, "orders"), headers=t.auth)
    assert got.status_code == 200
    body = got.json()
    assert (
        body["name"] == "orders" and body["latest_version"] == 2 and body["id"] == v1["workflow_id"]
    )
    assert [v["version"] for v in body["versions"]] == [2, 1]
    assert body["owner_id"] == t.app_hex and body["next_cursor"] is None
    assert "definition" not in body["versions"][0]


async def test_identical_republish_is_a_no_op_but_going_back_is_a_new_version(
    client: httpx.AsyncClient, t: PTenant
) -> None:
    await publish(client, t, "wf", doc("k1"))
    await publish(client, t, "wf", doc("k2"))
    # same content as the latest, written differently (key order, whitespace): 200, no new version
    reordered = (
        b'{"definition": {"steps": [ {"kind": "k2", "queue": "q", "type": "task", "id": "a"} ]}}'
    )
    same = await publish(client, t, "wf", reordered)
    assert (
        same.status_code == 200 and same.json()["version"] == 2 and same.json()["unchanged"] is True
    )
    # the same content as an older version is a new version
    back = await publish(client, t, "wf", doc("k1"))
    assert back.status_code == 201 and back.json()["version"] == 3
    got = (await client.get(url(t, "wf"), headers=t.auth)).json()
    assert [v["version"] for v in got["versions"]] == [3, 2, 1]
    assert got["versions"][0]["digest"] == got["versions"][2]["digest"]


async def test_definition_text_is_stored_byte_exact(client: httpx.AsyncClient, t: PTenant) -> None:
    text = '{ "description":"café",\n  "steps":[{"id":"a","type":"task","queue":"q","kind":"k","payload":{"price":19.90,"n":1E2}}]}'
    r = await publish(client, t, "exact", b'{"definition": ' + text.encode() + b"}")
    assert r.status_code == 201, r.text
    one = await client.get(url(t, "exact", "/versions/1"), headers=t.auth)
    assert one.status_code == 200
    raw = one.content
    start = raw.index(b'"definition":') + len(b'"definition":')
    assert raw[start : start + len(text.encode())] == text.encode()
    assert one.json()["definition"]["steps"][0]["payload"]["price"] == 19.9


async def test_invalid_definition_is_400_naming_the_step_and_writes_nothing(
    client: httpx.AsyncClient, t: PTenant
) -> None:
    bad = {
        "steps": [
            {"id": "a", "type": "task", "queue": "q", "kind": "k", "next": "ghost"},
            {"id": "b", "type": "task", "queue": "q", "kind": "k", "on_failure": "phantom"},
        ]
    }
    r = await publish(client, t, "broken", bad)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    d = err["details"]
    assert d["step"] == "a" and "ghost" in d["reason"] and d["rule"] == "dangling_reference"
    assert d["field"] == "definition.steps[0].next"
    assert [(e["step"], e["rule"]) for e in d["errors"]] == [
        ("a", "dangling_reference"),
        ("b", "dangling_reference"),
    ]
    assert (await client.get(url(t, "broken"), headers=t.auth)).status_code == 404


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"definition": {"steps": []}}', "definition.steps"),
        (b'{"definition": [1]}', "definition"),
        (
            b'{"definition": {"steps": [{"id": "a", "type": "task", "queue": "q", "kind": "k"}]}, "extra": 1}',
            "extra",
        ),
        (b'{"def": {}}', "def"),
        (b"{nope", None),
    ],
)
async def test_malformed_requests_are_400(
    client: httpx.AsyncClient, t: PTenant, content: bytes, field: str | None
) -> None:
    r = await publish(client, t, "wf", content)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"].get("field") == field


async def test_bad_workflow_name_is_400(client: httpx.AsyncClient, t: PTenant) -> None:
    r = await publish(client, t, "x" * 64, doc())
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "name"


async def test_auth_and_isolation(db: Database, client: httpx.AsyncClient, t: PTenant) -> None:
    assert (await publish(client, t, "wf", doc())).status_code == 201
    # no key
    r = await client.get(url(t, "wf"))
    assert r.status_code == 401
    # a key without workflows.manage
    _, key = await add_key(db, t, ["tasks.submit"])
    r = await client.get(url(t, "wf"), headers=bearer(key))
    assert r.status_code == 403
    r = await client.post(
        url(t, "wf", "/versions"), json={"definition": doc()}, headers=bearer(key)
    )
    assert r.status_code == 403
    # another tenant sees nothing: its own namespace has no such workflow, ours is not visible
    other = await new_tenant(db, namespace=unique("ns"))
    assert (await client.get(url(other, "wf"), headers=other.auth)).status_code == 404
    r = await client.get(f"/v1/namespaces/{t.namespace}/workflows/wf", headers=other.auth)
    assert r.status_code == 404
    # the same name in the other namespace is an independent workflow
    r = await publish(client, other, "wf", doc("other"))
    assert (r.status_code, r.json()["version"]) == (201, 1)
    assert r.json()["workflow_id"] != (await client.get(url(t, "wf"), headers=t.auth)).json()["id"]


async def test_unknown_workflow_and_version_are_404(client: httpx.AsyncClient, t: PTenant) -> None:
    assert (await client.get(url(t, "nope"), headers=t.auth)).status_code == 404
    await publish(client, t, "wf", doc())
    for v in ("2", "0", "abc", "99999999999"):
        assert (await client.get(url(t, "wf", f"/versions/{v}"), headers=t.auth)).status_code == 404


async def test_idempotency_key_replays_and_detects_mismatch(
    client: httpx.AsyncClient, t: PTenant
) -> None:
    first = await publish(client, t, "wf", doc("k1"), **{"Idempotency-Key": "deploy-1"})
    assert first.status_code == 201
    again = await publish(client, t, "wf", doc("k1"), **{"Idempotency-Key": "deploy-1"})
    assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    other = await publish(client, t, "wf", doc("k2"), **{"Idempotency-Key": "deploy-1"})
    assert other.status_code == 422
    latest = (await client.get(url(t, "wf"), headers=t.auth)).json()
    assert latest["latest_version"] == 1


async def test_list_workflows_and_version_paging(client: httpx.AsyncClient, t: PTenant) -> None:
    for i in range(5):
        await publish(client, t, "paged", doc(f"k{i}"))
    await publish(client, t, "another", doc())
    seen: list[int] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await client.get(url(t, "paged"), headers=t.auth, params=params)).json()
        seen += [v["version"] for v in page["versions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [5, 4, 3, 2, 1]
    # a cursor of another workflow is refused
    page = (await client.get(url(t, "paged"), headers=t.auth, params={"limit": "2"})).json()
    r = await client.get(url(t, "another"), headers=t.auth, params={"cursor": page["next_cursor"]})
    assert r.status_code == 400
    listed = (await client.get(f"/v1/namespaces/{t.namespace}/workflows", headers=t.auth)).json()
    assert [w["name"] for w in listed["items"]] == ["another", "paged"]
    assert listed["items"][1]["latest_version"] == 5


async def test_concurrent_first_publishes_get_versions_1_and_2(db: Database, t: PTenant) -> None:
    for round_ in range(5):
        name = f"race-{round_}"
        texts = [json.dumps(doc(f"k{i}")).encode() for i in range(2)]
        replies = await asyncio.gather(
            *(
                definitions.publish_version(db, CLI_ACTOR, t.namespace_id, name, text)
                for text in texts
            )
        )
        versions = sorted(json.loads(r.body)["version"] for r in replies)
        assert versions == [1, 2]
        assert all(r.status == 201 for r in replies)
        out = await definitions.get_workflow(db, t.namespace_id, name)
        assert out.latest_version == 2 and [v.version for v in out.versions] == [2, 1]


async def test_many_concurrent_publishes_are_gap_free(db: Database, t: PTenant) -> None:
    texts = [json.dumps(doc(f"k{i}")).encode() for i in range(8)]
    replies = await asyncio.gather(
        *(definitions.publish_version(db, CLI_ACTOR, t.namespace_id, "storm", x) for x in texts)
    )
    assert sorted(json.loads(r.body)["version"] for r in replies) == list(range(1, 9))
    rows = await db.fetchall(
        "SELECT v.version, v.definition FROM weave_definition_versions v JOIN weave_definitions d"
        " ON d.namespace_id = v.namespace_id AND d.id = v.definition_id"
        " WHERE d.namespace_id = %s AND d.name = 'storm' ORDER BY v.version",
        (t.namespace_id,),
    )
    assert [r["version"] for r in rows] == list(range(1, 9))
    assert sorted(r["definition"] for r in rows) == sorted(x.decode() for x in texts)


async def test_concurrent_identical_publishes_make_one_version(db: Database, t: PTenant) -> None:
    text = json.dumps(doc("same")).encode()
    replies = await asyncio.gather(
        *(
            definitions.publish_version(db, CLI_ACTOR, t.namespace_id, "twins", text)
            for _ in range(3)
        )
    )
    assert sorted(r.status for r in replies) == [200, 200, 201]
    assert {json.loads(r.body)["version"] for r in replies} == {1}


async def test_publish_writes_audit_and_event(
    db: Database, client: httpx.AsyncClient, t: PTenant
) -> None:
    r = await publish(client, t, "audited", doc())
    wid = bytes.fromhex(r.json()["workflow_id"])
    audit = await db.fetchall(
        "SELECT action, outcome FROM orbit_audit_events WHERE namespace_id = %s AND resource_id = %s",
        (t.namespace_id, wid.hex()),
    )
    assert [(a["action"], a["outcome"]) for a in audit] == [("workflows.publish", "ok")]
    events = await db.read(
        lambda tx: raw_events(tx, t.namespace_id, subject_kind="workflow", subject_id=wid)
    )
    assert [e["type"] for e in events] == ["workflow.version_published"]


async def test_engine_reads_a_version_compiled_and_cached(db: Database, t: PTenant) -> None:
    await definitions.publish_version(
        db, CLI_ACTOR, t.namespace_id, "engine", json.dumps(doc("v1")).encode()
    )
    await definitions.publish_version(
        db, CLI_ACTOR, t.namespace_id, "engine", json.dumps(doc("v2")).encode()
    )

    async def run(tx: Tx) -> tuple[str, str, bool]:
        row, latest = await definitions.resolve_version(tx, t.namespace_id, "engine")
        _, first = await definitions.resolve_version(tx, t.namespace_id, "engine", 1)
        d1 = await definitions.load_definition(tx, t.namespace_id, row.id, 1)
        d2 = await definitions.load_definition(tx, t.namespace_id, row.id, latest.version)
        again = await definitions.load_definition(tx, t.namespace_id, row.id, 1)
        s1, s2 = d1.steps["a"], d2.steps["a"]
        assert isinstance(s1, TaskStep) and isinstance(s2, TaskStep) and first.version == 1
        return s1.task.kind, s2.task.kind, again is d1

    assert await db.read(run) == ("v1", "v2", True)

    async def missing(tx: Tx) -> None:
        await definitions.resolve_version(tx, t.namespace_id, "engine", 3)

    from weave.errors import VersionNotFound, WorkflowNotFound

    with pytest.raises(VersionNotFound):
        await db.read(missing)

    async def unknown(tx: Tx) -> None:
        await definitions.resolve_version(tx, t.namespace_id, "nope")

    with pytest.raises(WorkflowNotFound):
        await db.read(unknown)
