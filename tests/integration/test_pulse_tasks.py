"""Task submission and reads against the real database: dedup (also under concurrency),
batches, quotas, idempotency keys, events, list filters and cursors, namespace isolation."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import msgspec
import pytest
from event_rows import raw_events
from pulse_fixtures import recount

from orbit.errors import IdempotencyMismatch, InvalidRequest
from orbit.idempotency import IdemRequest, request_digest
from orbit.storage import Database, Tx
from pulse import submit, tasks
from pulse.errors import QueueNotFound, QueueQuotaExceeded, TaskNotFound
from pulse.types import TaskListFilters, TaskSubmit


def body(**fields) -> TaskSubmit:
    fields.setdefault("queue", "default")
    fields.setdefault("kind", "k")
    return msgspec.json.decode(msgspec.json.encode(fields), type=TaskSubmit)


def raw(**fields) -> bytes:
    fields.setdefault("queue", "default")
    fields.setdefault("kind", "k")
    return msgspec.json.encode(fields)


async def count_tasks(db: Database, ns: bytes) -> int:
    async def run(tx: Tx) -> int:
        return int(
            await tx.fetchval("SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s", (ns,))
        )

    return await db.read(run)


async def test_submit_fields_and_frozen_policy(db, tenant) -> None:
    t = await tenant(retry={"max_attempts": 7, "backoff_initial_ms": 10, "backoff_max_ms": 20})
    deadline = "2099-01-01T00:00:00.5Z"
    res = await submit.submit_one(
        db,
        t.namespace_id,
        t.application_id,
        body(
            kind="send",
            pipeline_version="v2",
            dedup_key="u-1",
            payload={"user": 42},
            priority=9,
            delay_ms=60_000,
            deadline_at=deadline,
            retry_safe=True,
            concurrency_key="tenant-é",
        ),
    )
    assert res.status == 201
    task = res.json()
    assert task["deduplicated"] is False
    assert task["owner_id"] == t.owner_hex and task["queue"] == "default"
    assert task["state"] == "WAITING" and task["priority"] == 9
    assert task["max_attempts"] == 7 and task["retry"]["backoff_initial_ms"] == 10
    assert task["retry_safe"] is True and task["concurrency_key"] == "tenant-é"
    assert task["deadline_at"] == "2099-01-01T00:00:00.500000Z"
    created = datetime.fromisoformat(task["created_at"].rstrip("Z"))
    available = datetime.fromisoformat(task["available_at"].rstrip("Z"))
    assert available - created == timedelta(seconds=60)

    async def key_digest(tx: Tx) -> bytes:
        return await tx.fetchval(
            "SELECT concurrency_key_digest FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, bytes.fromhex(task["id"])),
        )

    import hashlib

    assert await db.read(key_digest) == hashlib.sha256("tenant-é".encode()).digest()

    # A later queue change does not touch the frozen policy.
    await t.add_queue("default", retry={"max_attempts": 1})
    again = await tasks.get_task(db, t.namespace_id, task["id"])
    assert again["max_attempts"] == 7


async def test_invalid_fields(db, tenant) -> None:
    t = await tenant()
    with pytest.raises(InvalidRequest) as info:
        await submit.submit_one(
            db,
            t.namespace_id,
            t.application_id,
            body(delay_ms=5, available_at="2030-01-01T00:00:00Z"),
        )
    assert info.value.field == "available_at"
    with pytest.raises(InvalidRequest) as info:
        await submit.submit_one(
            db, t.namespace_id, t.application_id, body(available_at="2030-01-01T00:00:00")
        )
    assert info.value.field == "available_at"
    with pytest.raises(InvalidRequest) as info:
        await submit.submit_one(db, t.namespace_id, t.application_id, body(dedup_key="x "))
    assert info.value.field == "dedup_key"
    with pytest.raises(InvalidRequest) as info:
        submit.decode_item(raw(priority=10))
    assert info.value.field == "priority"
    with pytest.raises(InvalidRequest) as info:
        submit.decode_item(raw(prority=1))
    assert info.value.field == "prority"
    with pytest.raises(QueueNotFound):
        await submit.submit_one(db, t.namespace_id, t.application_id, body(queue="nope"))
    assert await count_tasks(db, t.namespace_id) == 0


async def test_dedup_per_owner(db, tenant) -> None:
    t = await tenant()
    first = await t.submit(kind="a", dedup_key="d", payload=1)
    dup = await submit.submit_one(
        db, t.namespace_id, t.application_id, body(kind="a", dedup_key="d", payload=2)
    )
    assert dup.status == 200
    assert dup.json()["deduplicated"] is True and dup.json()["id"] == first["id"]
    assert dup.json()["payload"] == 1  # the existing task, untouched
    # identity parts: another kind, pipeline version or key is another task
    assert (await t.submit(kind="b", dedup_key="d"))["id"] != first["id"]
    assert (await t.submit(kind="a", dedup_key="d", pipeline_version="v2"))["id"] != first["id"]
    assert (await t.submit(kind="a", dedup_key="D"))["id"] != first["id"]
    # another owner (another application) with the same identity gets its own task
    o = await tenant()
    assert (await o.submit(kind="a", dedup_key="d"))["id"] != first["id"]
    # without dedup_key there is no identity
    x1, x2 = await t.submit(kind="a"), await t.submit(kind="a")
    assert x1["id"] != x2["id"]
    assert (await recount(db, t))["usage"]["unfinished_tasks"] == 6


async def test_concurrent_identical_submits_make_one_task(db, tenant) -> None:
    t = await tenant()
    await t.add_queue("q2")
    same = dict(kind="race", dedup_key="one", payload={"n": 1})
    results = await asyncio.gather(
        *(
            submit.submit_one(db, t.namespace_id, t.application_id, body(queue=q, **same))
            for q in ["default", "q2"] * 5  # two queues: the race reaches the unique index
        )
    )
    ids = {r.json()["id"] for r in results}
    assert len(ids) == 1
    assert sorted(r.status for r in results) == [200] * 9 + [201]
    assert await count_tasks(db, t.namespace_id) == 1
    c1 = await recount(db, t)
    c2 = await recount(db, t, t.queues["q2"])
    assert c1["usage"] == c1["rows"] and c2["usage"] == c2["rows"]


async def test_batch_mixed_items(db, tenant) -> None:
    t = await tenant()
    existing = await t.submit(kind="k", dedup_key="old")
    items = [
        raw(payload=1),
        raw(priority=42),  # invalid → 400
        raw(queue="missing"),  # 404
        raw(dedup_key="old"),  # dedup of an existing task → 200
        raw(dedup_key="twin", payload="a"),  # new
        raw(dedup_key="twin", payload="b"),  # twin inside the batch → 200, first one's task
        b"[1, 2]",  # not an object → 400
        b'{"queue": "default", "kind": "k", "payload": {"x": [1, 2.50, 1e5]}}',
    ]
    res = await submit.submit_batch(db, t.namespace_id, t.application_id, items)
    assert res.status == 200
    out = res.json()["items"]
    assert [i["status"] for i in out] == [201, 400, 404, 200, 201, 200, 400, 201]
    assert out[1]["error"]["code"] == "invalid_request"
    assert out[1]["error"]["details"]["field"] == "priority"
    assert out[2]["error"]["code"] == "not_found"
    assert out[3]["task"]["id"] == existing["id"] and out[3]["task"]["deduplicated"]
    assert out[5]["task"]["id"] == out[4]["task"]["id"] and out[5]["task"]["payload"] == "a"
    assert res.body.count(b'"payload":{"x": [1, 2.50, 1e5]}') == 1  # verbatim
    assert await count_tasks(db, t.namespace_id) == 4
    assert len(res.new_work) == 1
    c = await recount(db, t)
    assert c["usage"] == c["rows"]


async def test_batch_too_large_is_400(db, tenant) -> None:
    t = await tenant()
    with pytest.raises(InvalidRequest):
        await submit.submit_batch(db, t.namespace_id, t.application_id, [raw()] * 1001)


async def test_queue_quota_429_writes_nothing(db, tenant) -> None:
    t = await tenant(max_unfinished_tasks=2)
    await t.submit()
    await t.submit()
    events_before = await _event_count(db, t.namespace_id)
    with pytest.raises(QueueQuotaExceeded) as info:
        await submit.submit_one(db, t.namespace_id, t.application_id, body())
    assert info.value.status == 429 and info.value.headers()["Retry-After"] == "1"
    assert await count_tasks(db, t.namespace_id) == 2
    assert await _event_count(db, t.namespace_id) == events_before
    from pulse import queues

    q = await queues.get_queue(db, t.namespace_id, "default")
    assert q["usage"]["unfinished_tasks"] == 2 and q["usage"]["denials"]["quota"] == 1
    # a dedup hit is not a new task: no quota needed
    first = (await tasks.list_tasks(db, t.namespace_id, TaskListFilters()))["items"][0]
    assert first["dedup_key"] is None
    # batch: admitted in request order until the limit, the rest 429
    await t.add_queue("default", max_unfinished_tasks=4)
    res = await submit.submit_batch(db, t.namespace_id, t.application_id, [raw()] * 4)
    assert [i["status"] for i in res.json()["items"]] == [201, 201, 429, 429]
    assert await count_tasks(db, t.namespace_id) == 4


async def test_concurrent_submits_never_exceed_the_queue_quota(db, tenant) -> None:
    t = await tenant(max_unfinished_tasks=5)
    outcomes = await asyncio.gather(
        *(submit.submit_one(db, t.namespace_id, t.application_id, body()) for _ in range(16)),
        return_exceptions=True,
    )
    created = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, QueueQuotaExceeded)]
    assert len(created) == 5 and len(refused) == 11
    assert await count_tasks(db, t.namespace_id) == 5
    c = await recount(db, t)
    assert c["usage"] == c["rows"]


async def test_application_quota(db, tenant) -> None:
    t = await tenant()
    await t.add_queue("q2")

    async def set_quota(tx: Tx) -> None:
        await tx.execute(
            "UPDATE orbit_application_resources SET max_unfinished_tasks = 2"
            " WHERE application_id = %s",
            (t.application_id,),
        )

    await db.transaction(set_quota)
    await t.submit()
    await t.submit(queue="q2")
    with pytest.raises(QueueQuotaExceeded) as info:
        await submit.submit_one(db, t.namespace_id, t.application_id, body())
    assert info.value.details["scope"] == "application"

    async def usage(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT unfinished_tasks FROM orbit_application_resources"
                " WHERE application_id = %s",
                (t.application_id,),
            )
        )

    assert await db.read(usage) == 2


async def test_idempotency_key_replays(db, tenant) -> None:
    t = await tenant()
    data = raw(payload={"a": 1})
    idem = IdemRequest("key-1", request_digest("POST", "/v1/x/tasks", data))
    first = await submit.submit_one(
        db, t.namespace_id, t.application_id, body(payload={"a": 1}), idem=idem
    )
    again = await submit.submit_one(
        db, t.namespace_id, t.application_id, body(payload={"a": 1}), idem=idem
    )
    assert first.status == again.status == 201
    assert again.replayed and again.body == first.body
    assert await count_tasks(db, t.namespace_id) == 1
    other = IdemRequest("key-1", request_digest("POST", "/v1/x/tasks", raw(payload=2)))
    with pytest.raises(IdempotencyMismatch):
        await submit.submit_one(db, t.namespace_id, t.application_id, body(payload=2), idem=other)


async def _event_count(db: Database, ns: bytes) -> int:
    async def run(tx: Tx) -> int:
        return len(await raw_events(tx, ns))

    return await db.read(run)


async def test_accept_writes_raw_event(db, tenant) -> None:
    t = await tenant()
    task = await t.submit()

    async def run(tx: Tx) -> list[dict]:
        return await raw_events(tx, t.namespace_id, subject_id=bytes.fromhex(task["id"]))

    rows = await db.read(run)
    assert [r["type"] for r in rows] == ["task.accepted"]
    assert msgspec.json.decode(rows[0]["data"])["state"] == "WAITING"


async def test_get_404_for_unknown_malformed_and_other_namespace(db, tenant) -> None:
    t = await tenant()
    other = await t.other_namespace()
    task = await other.submit()
    for bad in (task["id"], "0" * 32, "not-an-id", task["id"].upper()):
        with pytest.raises(TaskNotFound):
            await tasks.get_task(db, t.namespace_id, bad)
        with pytest.raises(TaskNotFound):
            await tasks.list_attempts(db, t.namespace_id, bad)
    assert (await tasks.get_task(db, other.namespace_id, task["id"]))["id"] == task["id"]


async def test_list_filters_and_cursor(db, tenant) -> None:
    t = await tenant()
    await t.add_queue("q2")
    made = []
    for i in range(5):
        made.append(await t.submit(kind="even" if i % 2 == 0 else "odd", dedup_key=f"d{i}"))
    await t.submit(queue="q2", kind="even")
    o = await tenant()
    await o.submit(kind="even")

    def f(**kw) -> TaskListFilters:
        return TaskListFilters(**kw)

    all_items = (await tasks.list_tasks(db, t.namespace_id, f()))["items"]
    assert len(all_items) == 6
    evens = (await tasks.list_tasks(db, t.namespace_id, f(kind="even", queue="default")))["items"]
    assert [x["id"] for x in evens] == [made[0]["id"], made[2]["id"], made[4]["id"]]
    assert (await tasks.list_tasks(db, t.namespace_id, f(dedup_key="d3")))["items"][0][
        "id"
    ] == made[3]["id"]
    assert len((await tasks.list_tasks(db, t.namespace_id, f(state="WAITING")))["items"]) == 6
    assert (await tasks.list_tasks(db, t.namespace_id, f(state="FAILED")))["items"] == []
    mine = await tasks.list_tasks(db, t.namespace_id, f(owner_id=t.owner_hex))
    assert len(mine["items"]) == 6
    theirs = await tasks.list_tasks(db, t.namespace_id, f(owner_id=o.owner_hex))
    assert theirs["items"] == []
    assert (await tasks.list_tasks(db, t.namespace_id, f(queue="nope")))["items"] == []

    # paging through with a bound cursor
    seen, cursor = [], None
    while True:
        page = await tasks.list_tasks(db, t.namespace_id, f(kind="even"), limit=2, cursor=cursor)
        seen += [x["id"] for x in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 4 and len(set(seen)) == 4
    page = await tasks.list_tasks(db, t.namespace_id, f(kind="even"), limit=2)
    with pytest.raises(InvalidRequest) as info:
        await tasks.list_tasks(db, t.namespace_id, f(kind="odd"), cursor=page["next_cursor"])
    assert info.value.field == "cursor"
    with pytest.raises(InvalidRequest):
        await tasks.list_tasks(db, t.namespace_id, f(state="BOGUS"))
    with pytest.raises(InvalidRequest):
        await tasks.list_tasks(db, t.namespace_id, f(owner_id="xyz"))
