"""orbit.events on MariaDB: raw events, result-event sequence ranges, gap-free under rollback
and concurrency, snapshots returned byte for byte."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime

import msgspec
import pytest

from orbit import events
from orbit.events import NewEvent, ResultSnapshot
from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx


def snap(state: str = "SUCCEEDED", **kw: object) -> ResultSnapshot:
    fields: dict[str, object] = {
        "task_id": new_id(), "queue": "q", "kind": "k", "owner_id": new_id(), "state": state,
        "attempts": 1, "finished_at": datetime(2026, 1, 2, 3, 4, 5, 6) if state != "NEEDS_REVIEW" else None,
    }  # fmt: skip
    fields.update(kw)
    return ResultSnapshot(**fields)  # type: ignore[arg-type]


async def append(db: Database, ns: bytes, snaps: list[ResultSnapshot]) -> list[int]:
    async def run(tx: Tx) -> list[int]:
        return await events.append_result_events(tx, ns, snaps)

    return await db.transaction(run)


async def test_batches_take_consecutive_ranges_per_namespace(db: Database) -> None:
    ns, other = new_id(), new_id()
    assert await append(db, ns, [snap(), snap("FAILED"), snap("CANCELLED")]) == [1, 2, 3]
    assert await append(db, other, [snap()]) == [1]
    assert await append(db, ns, [snap("NEEDS_REVIEW")]) == [4]
    assert await append(db, ns, []) == []
    got = await events.list_result_events(db, ns, 0, 10)
    assert [e.seq for e in got] == [1, 2, 3, 4]
    assert [e.type for e in got] == [
        "task.succeeded",
        "task.failed",
        "task.cancelled",
        "task.needs_review",
    ]
    assert [e.seq for e in await events.list_result_events(db, ns, 2, 1)] == [3]

    async def last(tx: Tx) -> int:
        return await events.last_result_seq(tx, ns)

    assert await db.read(last) == 4


async def test_rollback_gives_the_numbers_back(db: Database) -> None:
    ns = new_id()
    await append(db, ns, [snap()])

    async def failing(tx: Tx) -> None:
        await events.append_result_events(tx, ns, [snap(), snap()])
        raise RuntimeError("effect failed after the events")

    with pytest.raises(RuntimeError):
        await db.transaction(failing)
    assert await append(db, ns, [snap()]) == [2]


async def test_unknown_state_writes_nothing(db: Database) -> None:
    ns = new_id()
    with pytest.raises(ValueError, match="RUNNING"):
        await append(db, ns, [snap(), snap("RUNNING")])
    assert await events.list_result_events(db, ns, 0, 10) == []


async def test_concurrent_appends_are_gap_free_and_unique(db: Database) -> None:
    ns = new_id()
    sizes = [random.randint(1, 3) for _ in range(40)]

    async def worker(chunk: list[int]) -> list[int]:
        out: list[int] = []
        for n in chunk:
            out += await append(db, ns, [snap() for _ in range(n)])
        return out

    results = await asyncio.gather(*(worker(sizes[i::8]) for i in range(8)))
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, sum(sizes) + 1))
    stored = await events.list_result_events(db, ns, 0, 500)
    assert [e.seq for e in stored] == seqs


async def test_snapshot_json_is_kept_byte_for_byte(db: Database) -> None:
    ns = new_id()
    result_text = '{"total": 1.50, "big": 12345678901234567890, "list": [1e3, "\\u00e9"]}'
    task_id, owner = new_id(), new_id()
    await append(
        db,
        ns,
        [
            snap(task_id=task_id, owner_id=owner, result=result_text),
            snap("FAILED", error={"type": "Boom", "message": "no"}),
            snap("FAILED", error=msgspec.Raw(b'{"type":"Raw"}'), result=b"[1.0]"),
        ],
    )
    first, second, third = await events.list_result_events(db, ns, 0, 10)
    assert first.result == result_text
    wire = msgspec.json.decode(msgspec.json.encode(first.to_wire()))
    assert msgspec.json.encode(first.to_wire()).count(b'"total": 1.50') == 1
    assert wire["task_id"] == id_hex(task_id) and wire["owner_id"] == id_hex(owner)
    assert wire["finished_at"] == "2026-01-02T03:04:05.000006Z"
    assert wire["created_at"].endswith("Z") and len(wire["created_at"]) == 27
    assert set(wire) == {
        "seq", "event_id", "type", "created_at", "task_id", "queue", "kind", "owner_id",
        "state", "result", "error", "attempts", "finished_at",
    }  # fmt: skip
    assert msgspec.json.decode(second.error or "") == {"type": "Boom", "message": "no"}
    assert msgspec.json.decode(third.error or "") == {"type": "Raw"} and third.result == "[1.0]"


async def test_raw_events_single_and_batch(db: Database) -> None:
    ns, subject, other = new_id(), new_id(), new_id()

    async def run(tx: Tx) -> list[bytes]:
        one = await events.append_event(
            tx, ns, "task.accepted", "task", subject, {"queue": "q"}, "req-1"
        )
        many = await events.append_events(
            tx,
            ns,
            [
                *(NewEvent(type="task.t", subject_kind="task", subject_id=s, data={"i": i})
                  for i, s in enumerate([subject, other, subject])),
                NewEvent(type="queue.x", subject_kind="queue", subject_id=other),
            ],
        )
        return [one, *many]

    ids = await db.transaction(run)
    # One batch row per (event type, subject kind) of the transaction.
    assert len(ids) == 3

    async def read(tx: Tx) -> tuple[list[events.RawEvent], list[events.RawEvent], int]:
        rows = await tx.fetchall(
            "SELECT subjects FROM orbit_event_batches WHERE namespace_id = %s ORDER BY subjects",
            (ns,),
        )
        assert [int(r["subjects"]) for r in rows] == [1, 1, 3]
        return (
            await events.subject_events(tx, ns, "task", subject),
            await events.namespace_events(tx, ns),
            len(rows),
        )

    mine, everything, batches = await db.read(read)
    assert batches == 3
    assert [(e.type, e.data) for e in mine] == [
        ("task.accepted", {"queue": "q"}), ("task.t", {"i": 0}), ("task.t", {"i": 2}),
    ]  # fmt: skip
    assert mine[0].request_id == "req-1" and mine[1].request_id is None
    assert all(e.subject_id == subject for e in mine)
    assert len(everything) == 5
    assert {e.subject_kind for e in everything} == {"task", "queue"}
