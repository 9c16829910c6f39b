"""Schedule controls on a real MariaDB with a pinned clock: trigger (exactly one occurrence,
idempotent with a key), backfill (bounded, exactly once, fills skipped fire times, never
one that ran), delete (history stays), and the four overlap policies in the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from event_rows import raw_events
from schedule_support import (  # noqa: F401 - sched_dsn_fixture, sdb_fixture: fixtures
    name,
    occurrences,
    put,
    quiesce,
    sched_dsn_fixture,
    schedule_row,
    sdb_fixture,
    tenant,
)

from orbit.errors import InvalidRequest, PreconditionFailed
from orbit.preconditions import Preconditions
from orbit.storage import DSN, Database, Tx
from pulse import schedule_controls as controls
from pulse import schedules
from pulse import tasks as task_service
from pulse.errors import QueueQuotaExceeded
from pulse.scheduler import Scheduler
from pulse.schedules import ScheduleNotFound

T0 = datetime(2031, 3, 3, 10, 0, 0)
MIN = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def _quiet(sched_dsn: DSN) -> Iterator[None]:
    yield
    quiesce(sched_dsn)


async def run(db: Database, now: datetime) -> Any:
    return await Scheduler(db).run_once(now=now)


def trigger_body(key: str | None = None) -> controls.TriggerBody:
    return controls.TriggerBody(idempotency_key=key)


def backfill_body(lo: datetime, hi: datetime) -> controls.BackfillBody:
    return msgspec.json.decode(
        msgspec.json.encode({"from": lo.isoformat() + "Z", "to": hi.isoformat() + "Z"}),
        type=controls.BackfillBody,
    )


async def task_rows(db: Database, t: Any) -> list[dict[str, Any]]:
    async def q(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT * FROM pulse_tasks WHERE namespace_id = %s AND source_kind = 'schedule'"
            " ORDER BY available_at, created_at",
            (t.namespace_id,),
        )

    return await db.read(q)


# ---------------------------------------------------------------------------- trigger


async def test_trigger_creates_exactly_one_occurrence_and_a_key_makes_it_idempotent(
    sdb: Database,
) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="0 3 * * *", task={"kind": "nightly", "payload": {"n": 1}})
    now = T0 + timedelta(minutes=7, microseconds=5)
    first = await controls.trigger_schedule(
        sdb, t.namespace_id, s, trigger_body("run-1"), now=now
    )
    assert first.reply.status == 201 and first.new_work == t.queue_id
    body = msgspec.json.decode(first.reply.body)
    occ, task = body["occurrence"], body["task"]
    assert occ["origin"] == "trigger" and occ["idempotency_key"] == "run-1"
    assert occ["fire_at"] == "2031-03-03T10:07:00.000005Z" and occ["outcome"] == "created"
    assert task["id"] == occ["task_id"] and task["state"] == "WAITING"
    assert task["kind"] == "nightly" and b'"payload":{"n":1}' in first.reply.body
    again = await controls.trigger_schedule(
        sdb, t.namespace_id, s, trigger_body("run-1"), now=now + MIN
    )
    assert again.reply.status == 200 and again.new_work is None
    same = msgspec.json.decode(again.reply.body)
    assert same["occurrence"]["id"] == occ["id"] and same["task"]["id"] == task["id"]
    assert same["replayed"] is True
    other = await controls.trigger_schedule(sdb, t.namespace_id, s, trigger_body(), now=now)
    assert other.reply.status == 201  # no key: a new occurrence each time, even at the same µs
    rows = await occurrences(sdb, t, s)
    assert [r["origin"] for r in rows] == ["trigger", "trigger"]
    assert len(await task_rows(sdb, t)) == 2
    row = await schedule_row(sdb, t, s)
    assert row["last_task_id"] == bytes.fromhex(msgspec.json.decode(other.reply.body)["task"]["id"])
    # the cadence is untouched: the 03:00 fire time still comes
    assert row["check_at"] == datetime(2031, 3, 4, 3, 0)


async def test_trigger_of_a_paused_schedule_fires_and_a_refused_task_writes_nothing(
    sdb: Database,
) -> None:
    t = await tenant(sdb, max_unfinished_tasks=2)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=3_600_000)
    await schedules.pause_schedule(sdb, t.namespace_id, s, now=T0 + MIN)  # fires T0 first
    res = await controls.trigger_schedule(sdb, t.namespace_id, s, trigger_body(), now=T0 + MIN)
    assert res.reply.status == 201
    with pytest.raises(QueueQuotaExceeded):
        await controls.trigger_schedule(sdb, t.namespace_id, s, trigger_body("k"), now=T0 + MIN)
    assert [r["origin"] for r in await occurrences(sdb, t, s)] == ["schedule", "trigger"]
    with pytest.raises(ScheduleNotFound):
        await controls.trigger_schedule(sdb, t.namespace_id, "absent", trigger_body())
    other = await t.other_namespace()
    with pytest.raises(ScheduleNotFound):  # same owner, other namespace: isolated
        await controls.trigger_schedule(sdb, other.namespace_id, s, trigger_body())


async def test_concurrent_triggers_with_one_key_create_one_occurrence(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=3_600_000)
    answers = await asyncio.gather(
        *(
            controls.trigger_schedule(sdb, t.namespace_id, s, trigger_body("once"), now=T0 + MIN)
            for _ in range(6)
        )
    )
    assert sorted(a.reply.status for a in answers) == [200] * 5 + [201]
    assert len({msgspec.json.decode(a.reply.body)["occurrence"]["id"] for a in answers}) == 1
    assert len(await occurrences(sdb, t, s)) == 1 and len(await task_rows(sdb, t)) == 1


# ---------------------------------------------------------------------------- backfill


async def test_backfill_fills_skipped_fire_times_exactly_once(sdb: Database) -> None:
    """Created at 10:00, every 10 min, catch-up window 15 min, scheduler down until 11:05:
    10:00-10:40 are skipped as one range, 10:50 and 11:00 fire late. A backfill of
    [10:00, 11:05) creates the five skipped ones only; a second identical one creates
    nothing."""
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=600_000, catchup_window_ms=900_000, grace_ms=0)
    await run(sdb, T0 + timedelta(hours=1, minutes=5))
    before = await occurrences(sdb, t, s)
    assert [(r["outcome"], r["skipped_count"]) for r in before] == [
        ("skipped", 5), ("created", None), ("created", None)
    ]  # fmt: skip
    res = await controls.backfill_schedule(
        sdb, t.namespace_id, s, backfill_body(T0, T0 + timedelta(hours=1, minutes=5)),
        now=T0 + timedelta(hours=1, minutes=6),
    )  # fmt: skip
    assert res.answer["count"] == 5 and res.answer["already_occurred"] == 2
    assert res.answer["fire_times"] == 7 and res.new_work == frozenset([t.queue_id])
    rows = await occurrences(sdb, t, s)
    filled = [r for r in rows if r["origin"] == "backfill"]
    assert [r["fire_at"] for r in filled] == [T0 + i * timedelta(minutes=10) for i in range(5)]
    tasks = await task_rows(sdb, t)
    assert len(tasks) == 7
    assert sorted(r["available_at"] for r in tasks) == [
        T0 + i * timedelta(minutes=10) for i in range(7)
    ]
    by_id = {r["id"]: r for r in tasks}
    for r in filled:  # each task points at its own occurrence
        assert by_id[r["task_id"]]["source_id"] == r["id"]
    again = await controls.backfill_schedule(
        sdb, t.namespace_id, s, backfill_body(T0, T0 + timedelta(hours=1, minutes=5)),
        now=T0 + timedelta(hours=1, minutes=7),
    )  # fmt: skip
    assert again.answer["count"] == 0 and again.answer["already_occurred"] == 7
    assert len(await task_rows(sdb, t)) == 7
    # backfilled tasks are not the previous run
    assert (await schedule_row(sdb, t, s))["last_task_id"] == rows[-1]["task_id"]


async def test_backfill_reaches_before_creation_and_stops_at_covered_until(
    sdb: Database,
) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=3_600_000)  # covered_until = T0
    res = await controls.backfill_schedule(
        sdb, t.namespace_id, s, backfill_body(T0 - timedelta(hours=3), T0 + timedelta(days=1)),
        now=T0 + timedelta(minutes=1),
    )  # fmt: skip
    assert res.answer["count"] == 3 and res.answer["to"] == "2031-03-03T10:00:00.000000Z"
    rows = await occurrences(sdb, t, s)
    assert [r["fire_at"] for r in rows] == [T0 - timedelta(hours=h) for h in (3, 2, 1)]
    assert {r["version"] for r in rows} == {1}
    # the scheduler still fires T0 (created at a fire time) and T0+1h itself, once each
    await run(sdb, T0 + timedelta(hours=1))
    rows = await occurrences(sdb, t, s)
    assert [r["fire_at"] for r in rows] == [T0 + timedelta(hours=h) for h in (-3, -2, -1, 0, 1)]


@pytest.mark.parametrize(
    ("lo", "hi", "field"),
    [
        (T0, T0, "to"),
        (T0 + MIN, T0, "to"),
        (T0 + timedelta(days=1), T0 + timedelta(days=2), "from"),
        (T0 - timedelta(hours=2), T0, "to"),  # 7200 fire times of an every-second schedule
    ],
)
async def test_invalid_or_too_large_backfills_are_400_and_write_nothing(
    sdb: Database, lo: datetime, hi: datetime, field: str
) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=1000)
    with pytest.raises(InvalidRequest) as err:
        await controls.backfill_schedule(
            sdb, t.namespace_id, s, backfill_body(lo, hi), now=T0 + timedelta(seconds=1)
        )
    assert err.value.field == field
    assert await occurrences(sdb, t, s) == [] and await task_rows(sdb, t) == []


async def test_concurrent_backfills_of_one_range_create_each_task_once(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=60_000)
    span = backfill_body(T0 - timedelta(minutes=200), T0)
    answers = await asyncio.gather(
        *(
            controls.backfill_schedule(sdb, t.namespace_id, s, span, now=T0 + MIN)
            for _ in range(4)
        )
    )
    assert sum(a.answer["count"] for a in answers) == 200
    assert sorted(a.answer["count"] for a in answers)[:3] == [0, 0, 0]
    assert len(await task_rows(sdb, t)) == 200 and len(await occurrences(sdb, t, s)) == 200


async def test_a_backfill_refused_by_a_quota_writes_nothing(sdb: Database) -> None:
    t = await tenant(sdb, max_unfinished_tasks=3)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=60_000)
    with pytest.raises(QueueQuotaExceeded):
        await controls.backfill_schedule(
            sdb, t.namespace_id, s, backfill_body(T0 - timedelta(minutes=5), T0), now=T0 + MIN
        )
    assert await occurrences(sdb, t, s) == [] and await task_rows(sdb, t) == []


# ---------------------------------------------------------------------------- delete


async def test_delete_keeps_history_and_frees_the_name(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    view = await put(sdb, t, s, now=T0, every_ms=600_000)
    await run(sdb, T0 + timedelta(minutes=10))
    with pytest.raises(PreconditionFailed):
        await controls.delete_schedule(sdb, t.namespace_id, s, pre=Preconditions(if_match=frozenset({7})))
    other = await t.other_namespace()
    with pytest.raises(ScheduleNotFound):
        await controls.delete_schedule(sdb, other.namespace_id, s)
    await controls.delete_schedule(sdb, t.namespace_id, s)
    with pytest.raises(ScheduleNotFound):
        await schedules.get_schedule(sdb, t.namespace_id, s)
    with pytest.raises(ScheduleNotFound):
        await controls.delete_schedule(sdb, t.namespace_id, s)

    async def history(tx: Tx) -> tuple[int, int, int]:
        sid = bytes.fromhex(view["id"])
        v = await tx.fetchval(
            "SELECT COUNT(*) FROM pulse_schedule_versions WHERE namespace_id = %s"
            " AND schedule_id = %s", (t.namespace_id, sid))  # fmt: skip
        o = await tx.fetchval(
            "SELECT COUNT(*) FROM pulse_schedule_occurrences WHERE namespace_id = %s"
            " AND schedule_id = %s", (t.namespace_id, sid))  # fmt: skip
        e = len(await raw_events(tx, t.namespace_id, type="schedule.deleted", subject_id=sid))
        return int(v), int(o), int(e)

    assert await sdb.read(history) == (1, 2, 1)
    assert len(await task_rows(sdb, t)) == 2
    # nothing fires any more; the name can be used again, from version 1
    assert (await run(sdb, T0 + timedelta(hours=5))).fired == 0
    fresh = await put(sdb, t, s, now=T0 + timedelta(hours=5), every_ms=600_000)
    assert fresh["version"] == 1 and fresh["id"] != view["id"]


# ---------------------------------------------------------------------------- overlap


async def _overlap(db: Database, policy: str) -> tuple[Any, str]:
    t = await tenant(db)
    s = name()
    await put(
        db, t, s, now=T0, every_ms=600_000, catchup_window_ms=86_400_000, overlap=policy
    )
    return t, s


def _summary(rows: list[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    return [(int((r["fire_at"] - T0) / timedelta(minutes=10)), r["outcome"], r["reason"])
            for r in rows]  # fmt: skip


async def test_overlap_allow_fires_every_time(sdb: Database) -> None:
    t, s = await _overlap(sdb, "allow")
    await run(sdb, T0 + timedelta(minutes=30))
    assert _summary(await occurrences(sdb, t, s)) == [
        (0, "created", None), (1, "created", None), (2, "created", None), (3, "created", None)
    ]  # fmt: skip
    assert (await schedules.get_schedule(sdb, t.namespace_id, s, now=T0))["overlap"] == "allow"


async def test_overlap_skip_skips_while_the_previous_run_is_unfinished(sdb: Database) -> None:
    t, s = await _overlap(sdb, "skip")
    await run(sdb, T0 + timedelta(minutes=20))  # a backlog of 3: the first fires
    rows = await occurrences(sdb, t, s)
    assert _summary(rows) == [(0, "created", None), (1, "skipped", "overlap"),
                              (2, "skipped", "overlap")]  # fmt: skip
    await run(sdb, T0 + timedelta(minutes=30))
    assert _summary(await occurrences(sdb, t, s))[-1] == (3, "skipped", "overlap")
    await task_service.cancel_task(sdb, t.namespace_id, rows[0]["task_id"].hex())
    await run(sdb, T0 + timedelta(minutes=40))
    assert _summary(await occurrences(sdb, t, s))[-1] == (4, "created", None)


async def test_overlap_buffer_one_holds_one_fire_time_until_the_previous_run_ends(
    sdb: Database,
) -> None:
    t, s = await _overlap(sdb, "buffer_one")
    await run(sdb, T0 + timedelta(minutes=20))
    rows = await occurrences(sdb, t, s)
    # 10:10 is held back (no row yet), 10:20 is skipped: one is buffered at most
    assert _summary(rows) == [(0, "created", None), (2, "skipped", "overlap")]
    row = await schedule_row(sdb, t, s)
    assert row["buffered_fire_at"] == T0 + timedelta(minutes=10)
    assert row["check_at"] == T0 + timedelta(minutes=20, seconds=1)  # polled while held
    view = await schedules.get_schedule(sdb, t.namespace_id, s, now=T0)
    assert view["buffered_fire_at"] == "2031-03-03T10:10:00.000000Z"
    await run(sdb, T0 + timedelta(minutes=21))  # still running: nothing
    assert len(await occurrences(sdb, t, s)) == 2
    await task_service.cancel_task(sdb, t.namespace_id, rows[0]["task_id"].hex())
    await run(sdb, T0 + timedelta(minutes=22))
    rows = await occurrences(sdb, t, s)
    assert _summary(rows)[1] == (1, "created", "buffered")
    assert (await schedule_row(sdb, t, s))["buffered_fire_at"] is None
    [buffered] = [r for r in rows if r["reason"] == "buffered"]
    tasks = {r["id"]: r for r in await task_rows(sdb, t)}
    assert tasks[buffered["task_id"]]["available_at"] == T0 + timedelta(minutes=10)
    # a backfill of the range never creates the held-back time twice
    await run(sdb, T0 + timedelta(minutes=30))  # 10:30 is held back now
    res = await controls.backfill_schedule(
        sdb, t.namespace_id, s, backfill_body(T0, T0 + timedelta(minutes=31)),
        now=T0 + timedelta(minutes=31),
    )  # fmt: skip
    assert res.answer["count"] == 1  # 10:20 (skipped) only; 10:30 stays with the buffer


async def test_overlap_cancel_previous_cancels_the_unfinished_run(sdb: Database) -> None:
    t, s = await _overlap(sdb, "cancel_previous")
    await run(sdb, T0)
    [first] = await occurrences(sdb, t, s)
    await run(sdb, T0 + timedelta(minutes=10))
    rows = await occurrences(sdb, t, s)
    assert _summary(rows) == [(0, "created", None), (1, "created", None)]
    tasks = {r["id"]: r for r in await task_rows(sdb, t)}
    assert tasks[first["task_id"]]["state"] == "CANCELLED"
    assert tasks[rows[1]["task_id"]]["state"] == "WAITING"
    # a backlog: each fire cancels the one before, the last one stays
    await run(sdb, T0 + timedelta(minutes=40))
    tasks = await task_rows(sdb, t)
    assert [r["state"] for r in tasks] == ["CANCELLED"] * 4 + ["WAITING"]


async def test_overlap_is_part_of_the_version(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, every_ms=600_000)
    changed = await put(sdb, t, s, now=T0 + MIN, every_ms=600_000, overlap="skip")
    assert changed["version"] == 2 and changed["overlap"] == "skip"
    same = await put(sdb, t, s, now=T0 + 2 * MIN, every_ms=600_000, overlap="skip")
    assert same["version"] == 2
    with pytest.raises(msgspec.ValidationError):
        await put(sdb, t, s, now=T0 + 2 * MIN, every_ms=600_000, overlap="queue")
