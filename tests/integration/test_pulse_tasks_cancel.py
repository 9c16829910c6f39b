"""Cancellation against the real database: the state matrix, attempts released, usage
counters, raw + result events written with the change, bulk cancel by owner/queue/kind."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from event_rows import raw_events
from pulse_fixtures import force_state, recount

from orbit.storage import Database, Tx
from pulse import tasks
from pulse.errors import TaskNotFound, TaskStateConflict


class Hub:
    def __init__(self) -> None:
        self.cancels: list[tuple[bytes, bytes, bytes]] = []

    async def request_cancel(self, ns: bytes, task_id: bytes, attempt_id: bytes) -> None:
        self.cancels.append((ns, task_id, attempt_id))


async def events_of(db: Database, ns: bytes, task_id: str) -> tuple[list[str], list[dict]]:
    """(raw event types, result event rows) of one task."""
    tid = bytes.fromhex(task_id)

    async def run(tx: Tx) -> tuple[list[str], list[dict]]:
        raw = await raw_events(tx, ns, subject_id=tid)
        res = await tx.fetchall(
            "SELECT seq, type, state, error, attempts, finished_at FROM orbit_result_events"
            " WHERE namespace_id = %s AND task_id = %s ORDER BY seq",
            (ns, tid),
        )
        return [r["type"] for r in raw], res

    return await db.read(run)


async def attempt_state(db: Database, ns: bytes, attempt_hex: str) -> str:
    async def run(tx: Tx) -> str:
        return str(
            await tx.fetchval(
                "SELECT state FROM pulse_attempts WHERE namespace_id = %s AND id = %s",
                (ns, bytes.fromhex(attempt_hex)),
            )
        )

    return await db.read(run)


async def test_cancel_waiting(db, tenant) -> None:
    t = await tenant()
    task = await t.submit()
    out = await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert out.status == 200 and out.task["state"] == "CANCELLED"
    assert out.task["finished_at"] is not None and out.task["error"]["type"] == "cancelled"
    assert out.task["state_version"] == 2
    raw, results = await events_of(db, t.namespace_id, task["id"])
    assert raw == ["task.accepted", "task.cancelled"]
    assert [(r["type"], r["state"]) for r in results] == [("task.cancelled", "CANCELLED")]
    assert msgspec.json.decode(results[0]["error"])["type"] == "cancelled"
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["usage"]["unfinished_tasks"] == 0
    # already cancelled: 200, nothing new written
    again = await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert again.status == 200 and again.task["revision"] == out.task["revision"]
    assert len((await events_of(db, t.namespace_id, task["id"]))[1]) == 1


async def test_cancel_leased_releases_the_offer(db, tenant) -> None:
    t = await tenant()
    task = await t.submit()
    forced = await force_state(db, t, task["id"], "LEASED")
    assert (await recount(db, t))["usage"]["reservations"] == 1
    out = await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert out.status == 200 and out.task["state"] == "CANCELLED"
    assert await attempt_state(db, t.namespace_id, forced["attempt_id"]) == "RELEASED"
    c = await recount(db, t)
    assert c["usage"] == c["rows"] and c["usage"]["reservations"] == 0


async def test_cancel_running_requests_and_notifies(db, tenant) -> None:
    t = await tenant()
    task = await t.submit()
    forced = await force_state(db, t, task["id"], "RUNNING")
    hub = Hub()
    out = await tasks.cancel_task(db, t.namespace_id, task["id"], hub=hub)
    assert out.status == 202
    assert out.task["state"] == "RUNNING" and out.task["cancel_requested"] is True
    assert hub.cancels == [
        (t.namespace_id, bytes.fromhex(task["id"]), bytes.fromhex(forced["attempt_id"]))
    ]
    raw, results = await events_of(db, t.namespace_id, task["id"])
    assert raw[-1] == "task.cancel_requested" and results == []
    # asking again: still 202, no second push, no second event
    again = await tasks.cancel_task(db, t.namespace_id, task["id"], hub=hub)
    assert again.status == 202 and len(hub.cancels) == 1
    assert (await events_of(db, t.namespace_id, task["id"]))[0].count("task.cancel_requested") == 1
    assert await attempt_state(db, t.namespace_id, forced["attempt_id"]) == "RUNNING"


@pytest.mark.parametrize("state", ["NEEDS_REVIEW", "SUCCEEDED", "FAILED"])
async def test_cancel_finished_or_review_is_409(db, tenant, state) -> None:
    t = await tenant()
    task = await t.submit()
    if state == "NEEDS_REVIEW":
        await force_state(db, t, task["id"], "NEEDS_REVIEW")
    else:

        async def finish(tx: Tx) -> None:
            await tx.execute(
                "UPDATE pulse_tasks SET state = %s, finished_at = UTC_TIMESTAMP(6),"
                " revision = revision + 1 WHERE namespace_id = %s AND id = %s",
                (state, t.namespace_id, bytes.fromhex(task["id"])),
            )

        await db.transaction(finish)
    with pytest.raises(TaskStateConflict) as info:
        await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert info.value.status == 409 and info.value.details["state"] == state


async def test_cancel_unknown_or_other_namespace_is_404(db, tenant) -> None:
    t = await tenant()
    other = await t.other_namespace()
    task = await other.submit()
    with pytest.raises(TaskNotFound):
        await tasks.cancel_task(db, t.namespace_id, task["id"])
    with pytest.raises(TaskNotFound):
        await tasks.cancel_task(db, t.namespace_id, "zz")
    assert (await tasks.get_task(db, other.namespace_id, task["id"]))["state"] == "WAITING"


async def test_bulk_cancel_by_owner_never_touches_other_owners(db, tenant) -> None:
    a = await tenant()
    b = await tenant()
    # b's tasks live in b's namespace; also put a second owner's tasks in a's namespace by
    # submitting with b's application id as owner (as a schedule/workflow owner would).
    from pulse import submit
    from pulse.types import TaskSubmit

    body = TaskSubmit(queue="default", kind="k")
    for _ in range(7):
        await a.submit()
    foreign = [
        (await submit.submit_one(db, a.namespace_id, b.application_id, body)).json()
        for _ in range(4)
    ]
    for _ in range(3):
        await b.submit()
    running = await a.submit()
    await force_state(db, a, running["id"], "RUNNING")
    leased = await a.submit()
    await force_state(db, a, leased["id"], "LEASED")

    hub = Hub()
    out = await tasks.cancel_bulk(db, a.namespace_id, owner_id=a.owner_hex, hub=hub, batch=3)
    assert out == {"cancelled": 8, "cancel_requested": 1}
    assert len(hub.cancels) == 1
    for f in foreign:
        assert (await tasks.get_task(db, a.namespace_id, f["id"]))["state"] == "WAITING"
    from pulse.types import TaskListFilters

    left = await tasks.list_tasks(db, b.namespace_id, TaskListFilters(state="WAITING"))
    assert len(left["items"]) == 3
    mine = await tasks.list_tasks(
        db, a.namespace_id, TaskListFilters(owner_id=a.owner_hex, state="WAITING")
    )
    assert mine["items"] == []
    c = await recount(db, a)
    assert c["usage"] == c["rows"] and c["usage"]["unfinished_tasks"] == 5  # 4 foreign + 1 running
    # a second call finds nothing left to do
    assert await tasks.cancel_bulk(db, a.namespace_id, owner_id=a.owner_hex) == {
        "cancelled": 0,
        "cancel_requested": 0,
    }


async def test_bulk_cancel_by_queue_and_kind(db, tenant) -> None:
    t = await tenant()
    await t.add_queue("q2")
    for _ in range(3):
        await t.submit(kind="x")
        await t.submit(kind="y")
        await t.submit(queue="q2", kind="x")
    out = await tasks.cancel_bulk(db, t.namespace_id, queue="default", kind="x")
    assert out == {"cancelled": 3, "cancel_requested": 0}
    out = await tasks.cancel_bulk(db, t.namespace_id, kind="x")
    assert out == {"cancelled": 3, "cancel_requested": 0}
    assert await tasks.cancel_bulk(db, t.namespace_id, queue="missing") == {
        "cancelled": 0,
        "cancel_requested": 0,
    }
    out = await tasks.cancel_bulk(db, t.namespace_id)
    assert out == {"cancelled": 3, "cancel_requested": 0}


async def test_result_events_sequence_increments_across_cancels(db, tenant) -> None:
    t = await tenant()
    made = [await t.submit() for _ in range(5)]
    await asyncio.gather(*(tasks.cancel_task(db, t.namespace_id, m["id"]) for m in made[:3]))
    await tasks.cancel_bulk(db, t.namespace_id, owner_id=t.owner_hex)

    async def seqs(tx: Tx) -> list[int]:
        rows = await tx.fetchall(
            "SELECT seq FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq",
            (t.namespace_id,),
        )
        return [int(r["seq"]) for r in rows]

    assert await db.read(seqs) == [1, 2, 3, 4, 5]


async def test_failed_transaction_writes_no_event(db, tenant) -> None:
    """The raw and result events commit or roll back with the change itself."""
    t = await tenant()
    task = await t.submit()

    class Boom(Exception):
        pass

    async def run(tx: Tx) -> None:
        from pulse import transitions
        from pulse.store import tasks as store

        row = await store.task_get(tx, t.namespace_id, bytes.fromhex(task["id"]), for_update=True)
        assert row is not None
        await store.task_cancel_if_unstarted(
            tx, t.namespace_id, row["id"], row["revision"], "{}", row["created_at"]
        )
        after = await store.task_get(tx, t.namespace_id, row["id"])
        await transitions.record(tx, t.namespace_id, after, transitions.EVENT_CANCELLED)
        raise Boom

    with pytest.raises(Boom):
        await db.transaction(run)
    raw, results = await events_of(db, t.namespace_id, task["id"])
    assert raw == ["task.accepted"] and results == []
    assert (await tasks.get_task(db, t.namespace_id, task["id"]))["state"] == "WAITING"
