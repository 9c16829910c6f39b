"""The batch-submit fast path (pulse/submit.py, docs/performance.md "Batch submit"): rows are
not read back after the insert (built by ``_as_stored``), the task and raw-event INSERTs carry
SQL literals (orbit/storage/literals.py), the answer's task objects come from
``_FreshViews``. Every shortcut is checked against what the database really stored."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from event_rows import raw_events
from pulse_fixtures import recount

from orbit.storage import Database, Tx
from orbit.storage import db as storage_db
from orbit.storage.literals import literal
from orbit.store import clock
from pulse import submit, submit_rows, transitions
from pulse.store import tasks as task_store
from pulse.types import TaskSubmit


def raw(**fields: Any) -> bytes:
    fields.setdefault("queue", "default")
    fields.setdefault("kind", "k")
    return msgspec.json.encode(fields)


#: Payload texts that stress the literals: quotes, backslashes, escapes, NUL escapes,
#: non-ASCII, 4-byte UTF-8, odd number spellings (all stored byte for byte).
PAYLOADS = [
    b'{"q": "it\'s", "dq": "say \\"hi\\""}',
    b'"back\\\\slash \\u0000 nul \\n nl"',
    b'{"x": [1, 2.50, 1e5, -0.0, 12345678901234567890123]}',
    '{"s": "été – 漢字 😀"}'.encode(),
    b'  {"spaced" :  true }  ',
    b"null",
    b'"%s %(x)s {cols}"',
]


async def _read_rows(db: Database, ns: bytes, ids: list[bytes]) -> dict[bytes, dict[str, Any]]:
    async def run(tx: Tx) -> dict[bytes, dict[str, Any]]:
        return await task_store.task_get_many(tx, ns, ids)

    return await db.read(run)


async def _events(db: Database, ns: bytes) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await raw_events(tx, ns, subject_kind="task")

    return await db.read(run)


async def test_mixed_statuses_in_one_batch(db, tenant) -> None:
    t = await tenant(max_unfinished_tasks=4)
    existing = await t.submit(dedup_key="old")  # 1 of 4
    items = [
        raw(payload=1),  # 201 (2 of 4)
        raw(priority=42),  # 400 (wire type)
        raw(queue="missing"),  # 404
        raw(dedup_key="old"),  # 200, existing row, no quota used
        raw(dedup_key="twin", payload="a"),  # 201 (3 of 4)
        raw(dedup_key="twin", payload="b"),  # 200, the twin's task
        raw(payload=2),  # 201 (4 of 4)
        raw(payload=3),  # 429
        raw(dedup_key="late"),  # 429 (a new identity still needs room)
        raw(available_at="2026-01-01T00:00:00"),  # 400 (no offset)
    ]
    previous, log = storage_db.STATEMENT_LOG, []
    storage_db.STATEMENT_LOG = log
    try:
        res = await submit.submit_batch(db, t.namespace_id, t.application_id, items)
    finally:
        storage_db.STATEMENT_LOG = previous
    assert clock.Q.clock_now not in log  # the stamp came with the queue's lookup
    out = res.json()["items"]
    assert [i["status"] for i in out] == [201, 400, 404, 200, 201, 200, 201, 429, 429, 400]
    assert out[3]["task"]["id"] == existing["id"] and out[3]["task"]["deduplicated"] is True
    assert out[5]["task"]["id"] == out[4]["task"]["id"] and out[5]["task"]["deduplicated"]
    assert out[5]["task"]["payload"] == "a"
    assert out[7]["error"]["code"] == out[8]["error"]["code"]
    assert out[9]["error"]["details"]["field"] == "available_at"
    assert res.refused == 2
    # Counters equal a recount; the denials are counted.
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["rows"]["unfinished_tasks"] == 4

    async def denials(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT denials_quota FROM pulse_queue_usage"
                " WHERE namespace_id = %s AND queue_id = %s",
                (t.namespace_id, t.queue_id),
            )
        )

    assert await db.read(denials) == 2
    # One task.accepted event per created task, none for the others.
    created = {bytes.fromhex(i["task"]["id"]) for i in out if i["status"] == 201}
    events = [e for e in await _events(db, t.namespace_id) if e["subject_id"] in created]
    assert sorted(e["subject_id"] for e in events) == sorted(created)
    assert {e["type"] for e in events} == {"task.accepted"}
    # The same batch again: everything with an identity dedups, the rest is refused.
    again = (await submit.submit_batch(db, t.namespace_id, t.application_id, items)).json()
    assert [i["status"] for i in again["items"]][3:7] == [200, 200, 200, 429]


async def test_rows_events_and_answer_equal_what_the_database_stored(db, tenant) -> None:
    t = await tenant(retry={"max_attempts": 7, "backoff_multiplier": 1.7})
    items = [raw(payload=msgspec.Raw(p)) for p in PAYLOADS] + [
        raw(kind="kind 'quoted' \\ back", dedup_key="d'k\\1", pipeline_version="v'1"),
        raw(priority=9, delay_ms=1500, max_attempts=3, retry_safe=True),
        raw(deadline_at="2030-05-06T07:08:09.123456+02:00", available_at="2029-01-01T00:00:00Z"),
        raw(concurrency_key="ck 😀 'x'"),
    ]
    res = await submit.submit_batch(
        db, t.namespace_id, t.application_id, items, request_id="req-fast"
    )
    out = res.json()["items"]
    assert [i["status"] for i in out] == [201] * len(items)
    ids = [bytes.fromhex(i["task"]["id"]) for i in out]
    stored = await _read_rows(db, t.namespace_id, ids)
    # The payload is stored byte for byte and answered byte for byte.
    # (Whitespace around the value belongs to the enclosing object, not to the payload.)
    for p, task_id in zip(PAYLOADS, ids, strict=False):
        assert stored[task_id]["payload"].encode() == p.strip()
        assert res.body.count(b'"payload":' + p.strip() + b",") >= 1
    # The answer is exactly what the task view of the stored rows gives (key order too).
    expected = [
        {"status": 201, "task": transitions.task_view(stored[i]) | {"deduplicated": False}}
        for i in ids
    ]
    assert res.body == msgspec.json.encode({"items": expected})
    # The rows the batch worked with (_as_stored) equal the stored rows, column by column.
    stamp = stored[ids[0]]["created_at"]
    for task_id in ids:
        row = dict(stored[task_id])
        ins = {k: row[k] for k in row if k in _INSERT_KEYS}
        assert submit_rows._as_stored(ins) == row
        assert row["created_at"] == row["state_changed_at"] == stamp
    # One raw event per task, the body record_many writes, the request id, the same stamp.
    events = {e["subject_id"]: e for e in await _events(db, t.namespace_id)}
    for task_id in ids:
        e = events[task_id]
        assert e["type"] == "task.accepted" and e["request_id"] == "req-fast"
        assert e["created_at"] == stamp
        data = transitions._raw_event_data(stored[task_id], {"source": "api"})
        assert msgspec.json.decode(e["data"]) == data


_INSERT_KEYS = {
    "namespace_id", "id", "owner_id", "queue_id", "queue_name", "kind", "pipeline_version",
    "dedup_key", "payload", "priority", "available_at", "deadline_at", "max_attempts",
    "retry_backoff_initial_ms", "retry_backoff_max_ms", "retry_backoff_multiplier",
    "retry_safe", "concurrency_key", "concurrency_key_digest", "state", "source_kind",
    "source_id", "created_at",
}  # fmt: skip


async def test_dedup_against_rows_committed_meanwhile(db, tenant) -> None:
    """Concurrent identical batches: one task per identity, every item answered 201 or 200
    with the same id, counters equal a recount."""
    t = await tenant()
    items = [raw(dedup_key=f"k{i}", payload=i) for i in range(50)] + [raw(payload="x")] * 5

    async def one() -> list[dict[str, Any]]:
        res = await submit.submit_batch(db, t.namespace_id, t.application_id, items)
        return res.json()["items"]  # type: ignore[no-any-return]

    answers = await asyncio.gather(*(one() for _ in range(4)))
    for k in range(50):
        ids = {a[k]["task"]["id"] for a in answers}
        assert len(ids) == 1
        assert sorted(a[k]["status"] for a in answers) == [200, 200, 200, 201]
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["rows"]["unfinished_tasks"] == 50 + 5 * 4


async def test_literals_round_trip(db) -> None:
    values = [
        "plain", "it's", "back\\slash", "nul\x00byte", "ctrl\x1az", "", "😀 漢字", "%s %%",
        b"\x00\x01'\\\xff", 0, -5, 2**63 - 1, 1.5, 1e300, -0.0, None, True,
    ]  # fmt: skip

    async def run(tx: Tx) -> list[Any]:
        out = []
        for v in values:
            got = await tx.fetchval("SELECT " + literal(v) + " AS v")
            out.append(got)
        return out

    got = await db.read(run)
    for v, g in zip(values, got, strict=True):
        if isinstance(v, bool):
            assert g == int(v)
        else:
            assert g == v, (v, g)


async def test_repeated_payloads_are_judged_alike(db, tenant) -> None:
    """Payloads are checked once per distinct bytes in a batch: every copy of an invalid
    one (encoded surrogate: passes the body parser, not the service) is a 400, every copy
    of a valid one is stored."""
    t = await tenant()
    bad = b'{"queue": "default", "kind": "k", "payload": "\xed\xa0\x80"}'
    good = raw(payload={"same": 1})
    res = await submit.submit_batch(
        db, t.namespace_id, t.application_id, [bad, good, bad, good, good]
    )
    out = res.json()["items"]
    assert [i["status"] for i in out] == [400, 201, 400, 201, 201]
    assert {i["error"]["details"]["field"] for i in out if i["status"] == 400} == {"payload"}
    ids = [bytes.fromhex(i["task"]["id"]) for i in out if i["status"] == 201]
    stored = await _read_rows(db, t.namespace_id, ids)
    assert {r["payload"] for r in stored.values()} == {'{"same":1}'}
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["rows"]["unfinished_tasks"] == 3


async def test_single_submit_answer_equals_the_stored_row(db, tenant) -> None:
    """A single submit (plain statements, BULK_MIN) also answers from the built row."""
    t = await tenant()
    body = msgspec.json.decode(
        raw(priority=3, delay_ms=250, payload=msgspec.Raw(PAYLOADS[0]), concurrency_key="c"),
        type=TaskSubmit,
    )
    res = await submit.submit_one(db, t.namespace_id, t.application_id, body)
    assert res.status == 201
    task_id = bytes.fromhex(res.json()["id"])
    stored = (await _read_rows(db, t.namespace_id, [task_id]))[task_id]
    assert res.body == msgspec.json.encode(transitions.task_view(stored) | {"deduplicated": False})
