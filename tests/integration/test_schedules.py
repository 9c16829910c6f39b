"""Schedules on a real MariaDB with a controllable clock: publishing versions, the scheduler's
exactly-once occurrences, catch-up and grace, version switch mid-backlog, pause/resume,
bounds, every_ms, DST, quotas, and the one-transaction guarantee.

Times are pinned (``now=``) everywhere, so every expectation is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta

import msgspec
import pytest
from schedule_support import body as put_body
from schedule_support import (
    fire_times,
    isolated_dsn,
    name,
    occurrences,
    put,
    quiesce,
    schedule_events,
    schedule_row,
    schedule_tasks,
    tenant,
)

from orbit import events as orbit_events
from orbit.errors import InvalidRequest, PreconditionFailed
from orbit.ids import id_hex
from orbit.preconditions import Preconditions
from orbit.storage import DSN, Database, TriggerRefused, Tx
from pulse import scheduler as scheduler_mod
from pulse import schedules
from pulse.errors import QueueNotFound
from pulse.scheduler import Scheduler
from pulse.schedules import ScheduleNotFound

US = timedelta(microseconds=1)
T0 = datetime(2031, 3, 3, 10, 0, 0)


@pytest.fixture(scope="module")
def sched_dsn() -> Iterator[DSN]:
    yield from isolated_dsn()


@pytest.fixture(scope="module")
async def sdb(sched_dsn: DSN) -> AsyncIterator[Database]:
    database = await Database.connect(sched_dsn, maxsize=8)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture(autouse=True)
def _quiet(sched_dsn: DSN) -> Iterator[None]:
    yield
    quiesce(sched_dsn)


async def run(db: Database, at: datetime, **kw: object) -> scheduler_mod.SchedulerStats:
    return await Scheduler(db, now=at, **kw).run_once()  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- publishing


async def test_put_creates_version_one_then_publishes_versions(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    v1 = await put(sdb, t, s, now=T0, cron="0 * * * *", timezone="Europe/Berlin")
    assert (v1["version"], v1["revision"], v1["paused"]) == (1, 1, False)
    assert v1["owner_id"] == t.owner_hex and v1["queue"] == "default"
    assert v1["tzdata_version"] == v1["tzdata_current"] and "tzdata" in v1["tzdata_version"]
    assert v1["next_fire_at"] == "2031-03-03T10:00:00.000000Z"
    assert v1["next_fire_at_local"] == "2031-03-03T11:00:00+01:00"
    assert v1["covered_until"] == "2031-03-03T10:00:00.000000Z"
    assert v1["published_at"] == "2031-03-03T10:00:00.000000Z"
    # identical PUT: a no-op (same revision, no new version)
    same = await schedules.put_schedule(
        sdb, t.namespace_id, t.application_id, s,
        put_body(cron="0 * * * *", timezone="Europe/Berlin"), now=T0 + timedelta(minutes=1),
    )  # fmt: skip
    assert not same.created and same.revision == 1 and same.schedule["version"] == 1
    # create-only on an existing schedule: 412
    with pytest.raises(PreconditionFailed):
        await schedules.put_schedule(
            sdb, t.namespace_id, t.application_id, s, put_body(cron="5 * * * *"),
            pre=Preconditions(if_none_match_any=True),
        )  # fmt: skip
    # stale If-Match: 412; current: a new version
    with pytest.raises(PreconditionFailed):
        await schedules.put_schedule(
            sdb, t.namespace_id, t.application_id, s, put_body(cron="5 * * * *"),
            pre=Preconditions(if_match=frozenset({7})),
        )  # fmt: skip
    res = await schedules.put_schedule(
        sdb, t.namespace_id, t.application_id, s, put_body(cron="5 * * * *"),
        pre=Preconditions(if_match=frozenset({1})), now=T0 + timedelta(minutes=2),
    )  # fmt: skip
    assert not res.created and res.schedule["version"] == 2 and res.revision == 2
    assert res.schedule["published_at"] == "2031-03-03T10:02:00.000000Z"
    assert res.schedule["next_fire_at"] == "2031-03-03T10:05:00.000000Z"
    events = [e["type"] for e in await schedule_events(sdb, t, bytes.fromhex(v1["id"]))]
    assert events == ["schedule.published", "schedule.published"]


async def test_versions_are_immutable_in_the_database(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    view = await put(sdb, t, s, now=T0, every_ms=60_000)

    async def tamper(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_schedule_versions SET every_ms = 1000 WHERE namespace_id = %s"
            " AND schedule_id = %s",
            (t.namespace_id, bytes.fromhex(view["id"])),
        )

    with pytest.raises(TriggerRefused) as err:
        await sdb.transaction(tamper)
    assert err.value.code == 1644


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "0 * * * *", "every_ms": 60_000}, "cron"),
        ({}, "cron"),
        ({"cron": "H * * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "0 * * * *", "timezone": "Europe/Atlantis"}, "timezone"),
        ({"cron": "0 * * * *", "start_at": "2031-01-02T00:00:00Z", "end_at": "2031-01-01T00:00:00Z"}, "end_at"),
        ({"cron": "0 * * * *", "start_at": "yesterday"}, "start_at"),
        ({"cron": "0 * * * *", "task": {"kind": "k", "payload": [1, 2]}, "catchup_window_ms": -1}, "catchup_window_ms"),
        ({"cron": "0 * * * *", "task": {"kind": "k "}}, "task.kind"),
        ({"cron": "0 * * * *", "task": {"kind": "k", "dedup_key": "x" * 250 + "{fire_at}"}}, "task.dedup_key"),
    ],
)  # fmt: skip
async def test_invalid_versions_are_400_naming_the_field(
    sdb: Database, fields: dict[str, object], field: str
) -> None:
    t = await tenant(sdb)
    with pytest.raises((InvalidRequest, msgspec.ValidationError)) as err:
        await put(sdb, t, name(), now=T0, **fields)
    if isinstance(err.value, InvalidRequest):
        assert err.value.field == field
    else:
        assert field in str(err.value)


async def test_unknown_queue_is_404_and_unknown_schedule_is_404(sdb: Database) -> None:
    t = await tenant(sdb)
    with pytest.raises(QueueNotFound):
        await put(sdb, t, name(), now=T0, cron="0 * * * *", queue="nope")
    with pytest.raises(ScheduleNotFound):
        await schedules.get_schedule(sdb, t.namespace_id, "absent")
    with pytest.raises(ScheduleNotFound):
        await schedules.pause_schedule(sdb, t.namespace_id, "absent")
    other = await t.other_namespace()
    s = name()
    await put(sdb, t, s, now=T0, cron="0 * * * *")
    with pytest.raises(ScheduleNotFound):  # same owner, other namespace: isolated
        await schedules.get_schedule(sdb, other.namespace_id, s)


# ---------------------------------------------------------------------------- firing


async def test_due_occurrence_task_event_and_progress_are_written_together(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    raw = (
        b'{"queue": "default", "cron": "0 * * * *", "task": {"kind": "report",'
        b' "payload": {"big": 12345678901234567890.5}, "priority": 7, "pipeline_version": "p2",'
        b' "max_attempts": 5, "retry_safe": true, "deadline_ms": 600000}}'
    )
    res = await schedules.put_schedule(
        sdb, t.namespace_id, t.application_id, s,
        msgspec.json.decode(raw, type=schedules.SchedulePut), now=T0 + timedelta(minutes=30),
    )  # fmt: skip
    view = res.schedule
    assert bytes(view["task"]["payload"]) == b'{"big": 12345678901234567890.5}'
    sid = bytes.fromhex(view["id"])
    assert (await schedule_row(sdb, t, s))["check_at"] == T0 + timedelta(hours=1)
    # not yet due
    await run(sdb, T0 + timedelta(minutes=59))
    assert await occurrences(sdb, t, s) == []
    now = T0 + timedelta(hours=1, seconds=5)
    await run(sdb, now)
    [occ] = await occurrences(sdb, t, s)
    assert occ["fire_at"] == T0 + timedelta(hours=1) and occ["outcome"] == "created"
    assert occ["fire_at_local"] == "2031-03-03T11:00:00+00:00" and occ["version"] == 1
    assert not occ["late"] and occ["reason"] is None and occ["created_at"] == now
    [task] = await schedule_tasks(sdb, t)
    assert task["id"] == occ["task_id"] and task["source_id"] == occ["id"]
    assert task["owner_id"] == t.application_id and task["source_kind"] == "schedule"
    assert task["kind"] == "report" and task["pipeline_version"] == "p2"
    assert task["priority"] == 7 and task["max_attempts"] == 5 and task["retry_safe"] == 1
    assert task["payload"] == '{"big": 12345678901234567890.5}'
    assert task["available_at"] == occ["fire_at"] and task["created_at"] == now
    assert task["deadline_at"] == occ["fire_at"] + timedelta(minutes=10)
    [event] = [e for e in await schedule_events(sdb, t, sid) if e["type"] == "schedule.fired"]
    data = msgspec.json.decode(event["data"])
    assert data["occurrence_id"] == id_hex(occ["id"]) and data["task_id"] == id_hex(task["id"])
    row = await schedule_row(sdb, t, s)
    assert row["covered_until"] == now + US and row["check_at"] == T0 + timedelta(hours=2)
    assert row["revision"] == 1  # progress is not configuration: the ETag stays
    # the same clock again: nothing new
    stats = await run(sdb, now)
    assert stats.fired == 0 and len(await occurrences(sdb, t, s)) == 1


async def test_a_failure_inside_the_step_leaves_nothing_behind(
    sdb: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Task, occurrence, event and progress are one transaction: break the event write of
    the second occurrence and nothing of the step survives; the next round does it all."""
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="*/10 * * * *", catchup_window_ms=86_400_000)
    real = orbit_events.append_event
    calls = {"n": 0}

    async def flaky(tx: Tx, ns: bytes, type: str, *a: object, **kw: object) -> bytes:
        if type == scheduler_mod.EVENT_FIRED:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("power cut")
        return await real(tx, ns, type, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(orbit_events, "append_event", flaky)
    stats = await run(sdb, T0 + timedelta(minutes=25))
    assert stats.errors == 1 and stats.fired == 0
    assert await occurrences(sdb, t, s) == [] and await schedule_tasks(sdb, t) == []
    row = await schedule_row(sdb, t, s)
    assert row["covered_until"] == T0  # no progress either
    # the failing schedule was backed off so it cannot block the others
    assert row["check_at"] == T0 + timedelta(minutes=25, seconds=scheduler_mod.ERROR_BACKOFF_S)
    monkeypatch.setattr(orbit_events, "append_event", real)
    await run(sdb, T0 + timedelta(minutes=25, seconds=10))  # backed off: not yet
    assert await occurrences(sdb, t, s) == []
    await run(sdb, T0 + timedelta(minutes=25, seconds=scheduler_mod.ERROR_BACKOFF_S))
    occ = await occurrences(sdb, t, s)
    assert fire_times(occ) == [T0, T0 + timedelta(minutes=10), T0 + timedelta(minutes=20)]
    assert sorted(x["id"] for x in await schedule_tasks(sdb, t)) == sorted(
        o["task_id"] for o in occ
    )


async def test_catch_up_window_and_grace_after_downtime(sdb: Database) -> None:
    """Worked example of docs/api/schedules.md: every 10 minutes, grace 60 s, catch-up 30
    min, created at 10:00, scheduler down until 11:05:30."""
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="*/10 * * * *", grace_ms=60_000,
              catchup_window_ms=1_800_000)  # fmt: skip
    now = T0 + timedelta(hours=1, minutes=5, seconds=30)
    await run(sdb, now)
    occ = await occurrences(sdb, t, s)
    skipped = [o for o in occ if o["outcome"] == "skipped"]
    assert len(skipped) == 1
    [rng] = skipped
    assert rng["fire_at"] == T0 and rng["reason"] == "outside_catchup"
    assert rng["covered_until"] == now - timedelta(minutes=30)  # 10:35:30, exclusive
    assert rng["skipped_count"] == 4  # 10:00, 10:10, 10:20, 10:30
    assert rng["task_id"] is None
    fired = [o for o in occ if o["outcome"] == "created"]
    assert [(o["fire_at"].strftime("%H:%M"), bool(o["late"])) for o in fired] == [
        ("10:40", True), ("10:50", True), ("11:00", True),
    ]  # fmt: skip
    # back to normal: 11:10 fired 30 s late is on time (inside grace)
    await run(sdb, T0 + timedelta(hours=1, minutes=10, seconds=30))
    last = (await occurrences(sdb, t, s))[-1]
    assert last["fire_at"] == T0 + timedelta(hours=1, minutes=10) and not last["late"]
    assert len(await schedule_tasks(sdb, t)) == 4


async def test_grace_and_catch_up_boundaries_are_inclusive(sdb: Database) -> None:
    t = await tenant(sdb)
    s1, s2, s3 = name(), name(), name()
    for s in (s1, s2, s3):
        await put(sdb, t, s, now=T0, cron="0 11 * * *", grace_ms=60_000,
                  catchup_window_ms=600_000)  # fmt: skip
    fire = T0 + timedelta(hours=1)
    await Scheduler(sdb, now=fire + timedelta(seconds=60)).step()  # exactly grace: on time
    await Scheduler(sdb, now=fire + timedelta(minutes=10)).step()  # exactly catch-up: late
    await Scheduler(sdb, now=fire + timedelta(minutes=10, microseconds=1)).step()  # skipped
    by_outcome = []
    for s in (s1, s2, s3):
        by_outcome += [
            (o["outcome"], bool(o["late"]), o["skipped_count"])
            for o in await occurrences(sdb, t, s)
        ]
    by_outcome.sort()
    assert by_outcome == [("created", False, None), ("created", True, None), ("skipped", False, 1)]


async def test_version_switch_mid_backlog_keeps_old_occurrences(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="0 * * * *", catchup_window_ms=86_400_000,
              task={"kind": "old"})  # fmt: skip
    # The scheduler is down; at 13:30 a new version is published (If-Match "1").
    res = await schedules.put_schedule(
        sdb, t.namespace_id, t.application_id, s,
        put_body(cron="30 * * * *", catchup_window_ms=86_400_000, task={"kind": "new"}),
        pre=Preconditions(if_match=frozenset({1})), now=T0 + timedelta(hours=3, minutes=30),
    )  # fmt: skip
    assert res.schedule["version"] == 2
    assert (await schedule_row(sdb, t, s))["check_at"] == T0  # the old backlog is still due
    await run(sdb, T0 + timedelta(hours=5, seconds=1), batch=2)  # several transactions
    occ = await occurrences(sdb, t, s)
    assert [(o["fire_at"].strftime("%H:%M"), o["version"]) for o in occ] == [
        ("10:00", 1), ("11:00", 1), ("12:00", 1), ("13:00", 1), ("13:30", 2), ("14:30", 2),
    ]  # fmt: skip
    kinds = {x["id"]: x["kind"] for x in await schedule_tasks(sdb, t)}
    assert [kinds[o["task_id"]] for o in occ] == ["old"] * 4 + ["new"] * 2


async def test_publish_time_never_precedes_covered_until(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="*/5 * * * *")
    await run(sdb, T0 + timedelta(minutes=20))
    # A publish with an (injected) clock behind the scheduler's progress starts at
    # covered_until: nothing already covered is re-decided.
    res = await schedules.put_schedule(
        sdb, t.namespace_id, t.application_id, s, put_body(cron="*/2 * * * *"),
        now=T0 + timedelta(minutes=3),
    )  # fmt: skip
    assert res.schedule["published_at"] == "2031-03-03T10:20:00.000001Z"
    await run(sdb, T0 + timedelta(minutes=25))
    occ = await occurrences(sdb, t, s)
    assert [(o["fire_at"].strftime("%M"), o["version"]) for o in occ] == [
        ("00", 1), ("05", 1), ("10", 1), ("15", 1), ("20", 1), ("22", 2), ("24", 2),
    ]  # fmt: skip


async def test_pause_fires_what_is_due_then_resume_records_the_pause_as_skipped(
    sdb: Database,
) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="0 * * * *", catchup_window_ms=86_400_000)
    await run(sdb, T0 + timedelta(seconds=1))
    # 11:00 is due but the scheduler has not run: pause fires it first
    paused = await schedules.pause_schedule(
        sdb, t.namespace_id, s, now=T0 + timedelta(hours=1, seconds=30)
    )
    assert paused["paused"] and paused["control_revision"] == 2 and paused["next_fire_at"] is None
    again = await schedules.pause_schedule(sdb, t.namespace_id, s, now=T0 + timedelta(hours=2))
    assert again["control_revision"] == 2  # idempotent
    assert fire_times(await occurrences(sdb, t, s)) == [T0, T0 + timedelta(hours=1)]
    stats = await run(sdb, T0 + timedelta(hours=4))
    assert stats.steps == 0  # paused schedules are not claimed
    resumed = await schedules.resume_schedule(
        sdb, t.namespace_id, s, now=T0 + timedelta(hours=4, minutes=10)
    )
    assert not resumed["paused"] and resumed["control_revision"] == 3
    assert resumed["next_fire_at"] == "2031-03-03T15:00:00.000000Z"
    skipped = [o for o in await occurrences(sdb, t, s) if o["outcome"] == "skipped"]
    assert [(o["fire_at"], o["covered_until"], o["skipped_count"], o["reason"]) for o in skipped] == [
        (T0 + timedelta(hours=2), T0 + timedelta(hours=4, minutes=10) + US, 3, "paused"),
    ]  # fmt: skip
    await run(sdb, T0 + timedelta(hours=5, seconds=1))
    assert fire_times(await occurrences(sdb, t, s))[-1] == T0 + timedelta(hours=5)
    same = await schedules.resume_schedule(sdb, t.namespace_id, s, now=T0 + timedelta(hours=6))
    assert same["control_revision"] == 3
    types = [e["type"] for e in await schedule_events(sdb, t, bytes.fromhex(same["id"]))]
    assert types.count("schedule.paused") == 1 and types.count("schedule.resumed") == 1


async def test_start_and_end_bound_the_schedule(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    view = await put(sdb, t, s, now=T0, cron="*/15 * * * *",
                     start_at="2031-03-03T10:20:00Z", end_at="2031-03-03T11:00:00Z",
                     catchup_window_ms=86_400_000)  # fmt: skip
    assert view["next_fire_at"] == "2031-03-03T10:30:00.000000Z"
    await run(sdb, T0 + timedelta(hours=2))
    assert fire_times(await occurrences(sdb, t, s)) == [
        T0 + timedelta(minutes=30), T0 + timedelta(minutes=45),
    ]  # fmt: skip
    row = await schedule_row(sdb, t, s)
    assert row["check_at"] is None  # nothing left: never scanned again
    view = await schedules.get_schedule(sdb, t.namespace_id, s, now=T0 + timedelta(hours=3))
    assert view["next_fire_at"] is None


async def test_every_ms_fires_on_multiples_of_the_anchor(sdb: Database) -> None:
    t = await tenant(sdb)
    s1, s2 = name(), name()
    await put(sdb, t, s1, now=T0 + timedelta(seconds=7), every_ms=90_000)  # epoch anchor
    await put(sdb, t, s2, now=T0, every_ms=90_000, start_at="2031-03-03T10:00:10.5Z",
              timezone="Asia/Kolkata")  # fmt: skip
    await run(sdb, T0 + timedelta(minutes=5))
    epoch = datetime(1970, 1, 1)
    got1 = fire_times(await occurrences(sdb, t, s1))
    assert got1 and all((f - epoch) % timedelta(milliseconds=90_000) == timedelta(0) for f in got1)
    assert got1[0] - (T0 + timedelta(seconds=7)) < timedelta(seconds=90)
    occ2 = await occurrences(sdb, t, s2)
    anchor = datetime(2031, 3, 3, 10, 0, 10, 500000)
    assert fire_times(occ2) == [anchor + k * timedelta(seconds=90) for k in range(4)]
    assert occ2[0]["fire_at_local"] == "2031-03-03T15:30:10.500000+05:30"


async def test_long_outage_is_one_skipped_row_with_its_count(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="* * * * * *", grace_ms=1000, catchup_window_ms=3000,
              timezone="Europe/Berlin")  # fmt: skip
    now = T0 + timedelta(days=40)  # crosses the spring-forward of 2031-03-30
    stats = await run(sdb, now)
    occ = await occurrences(sdb, t, s)
    [rng] = [o for o in occ if o["outcome"] == "skipped"]
    assert rng["fire_at"] == T0 and rng["covered_until"] == now - timedelta(seconds=3)
    # every UTC second fires in spring (the gap collapses into the transition instant)
    assert rng["skipped_count"] == 40 * 86_400 - 3
    assert fire_times(occ) == [now - timedelta(seconds=k) for k in (3, 2, 1, 0)]
    assert stats.skipped_times == rng["skipped_count"]


async def test_dst_gap_and_repeat_fire_once(sdb: Database) -> None:
    t = await tenant(sdb)
    gap, rep = name(), name()
    await put(sdb, t, gap, now=datetime(2031, 3, 29), cron="30 2 * * *",
              timezone="Europe/Berlin", catchup_window_ms=86_400_000)  # fmt: skip
    await put(sdb, t, rep, now=datetime(2031, 10, 25), cron="*/30 1-2 * * *",
              timezone="America/New_York", catchup_window_ms=86_400_000)  # fmt: skip
    await run(sdb, datetime(2031, 3, 31))
    assert [(o["fire_at"], o["fire_at_local"]) for o in await occurrences(sdb, t, gap)] == [
        (datetime(2031, 3, 29, 1, 30), "2031-03-29T02:30:00+01:00"),
        (datetime(2031, 3, 30, 1, 0), "2031-03-30T03:00:00+02:00"),  # 02:30 does not exist
    ]  # fmt: skip
    quiesce_one = await schedules.pause_schedule(
        sdb, t.namespace_id, gap, now=datetime(2031, 3, 31)
    )
    assert quiesce_one["paused"]
    await run(sdb, datetime(2031, 11, 3))
    locals_ = [o["fire_at_local"] for o in await occurrences(sdb, t, rep)
               if o["fire_at"] >= datetime(2031, 11, 2)]  # fmt: skip
    # 2031-11-02: 01:00–01:59 happens twice (EDT, then EST): each time fires once
    assert locals_ == [
        "2031-11-02T01:00:00-04:00", "2031-11-02T01:30:00-04:00",
        "2031-11-02T02:00:00-05:00", "2031-11-02T02:30:00-05:00",
    ]  # fmt: skip


async def test_quota_refusal_defers_then_fires_late(sdb: Database) -> None:
    t = await tenant(sdb, max_unfinished_tasks=1)
    s = name()
    await put(sdb, t, s, now=T0, cron="*/10 * * * *", grace_ms=0,
              catchup_window_ms=86_400_000)  # fmt: skip
    now = T0 + timedelta(minutes=15)
    stats = await run(sdb, now)
    assert stats.fired == 1 and stats.deferred == 1
    row = await schedule_row(sdb, t, s)
    assert row["covered_until"] == T0 + US  # 10:00 done, 10:10 still pending
    assert row["check_at"] == now + timedelta(seconds=scheduler_mod.DEFER_S)
    assert (await run(sdb, now)).steps == 0  # deferred: not claimed again at once
    await t.add_queue("default", max_unfinished_tasks=10)
    await run(sdb, now + timedelta(seconds=2))
    occ = await occurrences(sdb, t, s)
    assert [(o["fire_at"].strftime("%H:%M"), bool(o["late"])) for o in occ] == [
        ("10:00", True), ("10:10", True),
    ]  # fmt: skip


async def test_dedup_rule_and_missing_queue(sdb: Database) -> None:
    t = await tenant(sdb)
    daily, singleton = name(), name()
    await put(sdb, t, daily, now=T0, cron="0 * * * *", catchup_window_ms=86_400_000,
              task={"kind": "k", "dedup_key": "{schedule}@{fire_at}"})  # fmt: skip
    await put(sdb, t, singleton, now=T0, cron="0 * * * *", catchup_window_ms=86_400_000,
              task={"kind": "k", "dedup_key": "only-one"})  # fmt: skip
    await run(sdb, T0 + timedelta(hours=1, seconds=1))
    d = await occurrences(sdb, t, daily)
    tasks = {x["id"]: x for x in await schedule_tasks(sdb, t)}
    assert [tasks[o["task_id"]]["dedup_key"] for o in d] == [
        f"{daily}@2031-03-03T10:00:00.000000Z", f"{daily}@2031-03-03T11:00:00.000000Z",
    ]  # fmt: skip
    one = await occurrences(sdb, t, singleton)
    assert [o["outcome"] for o in one] == ["created", "created"]
    assert one[0]["task_id"] == one[1]["task_id"] and one[1]["reason"] == "deduplicated"
    # a version whose queue disappeared cannot create tasks: the occurrence says why
    await t.add_queue("temp")
    await put(sdb, t, daily, now=T0 + timedelta(hours=1, seconds=2), cron="0 * * * *",
              queue="temp")  # fmt: skip

    async def drop_queue(tx: Tx) -> None:
        await tx.execute(
            "DELETE FROM pulse_queues WHERE namespace_id = %s AND name = 'temp'", (t.namespace_id,)
        )

    await sdb.transaction(drop_queue)
    await run(sdb, T0 + timedelta(hours=2, seconds=1))
    last = (await occurrences(sdb, t, daily))[-1]
    assert (last["outcome"], last["reason"], last["task_id"]) == (
        "skipped",
        "queue_not_found",
        None,
    )
    assert last["skipped_count"] == 1 and last["covered_until"] == last["fire_at"] + US


async def test_occurrence_list_pages_newest_first_with_filters(sdb: Database) -> None:
    t = await tenant(sdb)
    s = name()
    await put(sdb, t, s, now=T0, cron="*/10 * * * *", grace_ms=0, catchup_window_ms=1_200_000)
    await run(sdb, T0 + timedelta(hours=1))  # 10:00–10:30 skipped (one row), 10:40–11:00 fired
    page = await schedules.list_occurrences(sdb, t.namespace_id, s, limit=2)
    assert [i["fire_at"][11:16] for i in page["items"]] == ["11:00", "10:50"]
    page2 = await schedules.list_occurrences(
        sdb, t.namespace_id, s, limit=2, cursor=page["next_cursor"]
    )
    assert [i["fire_at"][11:16] for i in page2["items"]] == ["10:40", "10:00"]
    assert page2["next_cursor"] is None
    rng = page2["items"][1]
    assert rng["outcome"] == "skipped" and rng["skipped_count"] == 4
    assert rng["covered_until"] == "2031-03-03T10:40:00.000000Z" and rng["task_id"] is None
    skipped = await schedules.list_occurrences(sdb, t.namespace_id, s, outcome="skipped")
    assert len(skipped["items"]) == 1
    with pytest.raises(InvalidRequest):  # a cursor is bound to its filters
        await schedules.list_occurrences(sdb, t.namespace_id, s, outcome="created",
                                         cursor=page["next_cursor"])  # fmt: skip
    with pytest.raises(InvalidRequest):
        await schedules.list_occurrences(sdb, t.namespace_id, s, outcome="late")


async def test_more_versions_than_one_load_are_caught_up_in_order(sdb: Database) -> None:
    """55 versions published while the scheduler was down (more than one load of versions,
    pulse.scheduler.VERSION_WINDOW): every fire time keeps the version of its segment."""
    t = await tenant(sdb)
    s = name()
    versions = 55
    assert versions > scheduler_mod.VERSION_WINDOW
    for i in range(1, versions + 1):
        view = await put(sdb, t, s, now=T0 + timedelta(minutes=i - 1), every_ms=30_000,
                         catchup_window_ms=86_400_000, task={"kind": f"k{i}"})  # fmt: skip
        assert view["version"] == i
    stats = await run(sdb, T0 + timedelta(minutes=60))
    assert stats.errors == 0
    occ = await occurrences(sdb, t, s)
    expected = [(T0 + k * timedelta(seconds=30), min(versions, k // 2 + 1)) for k in range(121)]
    assert [(o["fire_at"], o["version"]) for o in occ] == expected
    kinds = {x["id"]: x["kind"] for x in await schedule_tasks(sdb, t)}
    assert all(kinds[o["task_id"]] == f"k{o['version']}" for o in occ)
